"""The decisions of admission that need no API: whether a job can be admitted into its Episode at all,
and the ledger's side, run inside the Episode's compare-and-swap."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from graders.tasks import Task, UnknownTaskError, get_task
from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import AgentJobSpec, status_of
from posttrain_operator.api.rules import (
    allowed_flavors,
    grader_flavor,
    jobs_running,
    limits_in_force,
)
from posttrain_operator.jobspec import InvalidJob, validate_against_task
from posttrain_operator.reconcile.jobs import admitting_phases


@dataclass(frozen=True)
class Rejection:
    """Why a job is refused: a PascalCase reason clients match on, and a message for the agent."""

    reason: str
    message: str


def decide_admission(
    job: dict[str, Any], spec: AgentJobSpec, episode: dict[str, Any] | None
) -> tuple[Task, EpisodeSpec, list[str]] | Rejection:
    """Everything about a job that can be refused without the ledger."""
    if episode is None:
        return Rejection(cond.EPISODE_NOT_FOUND, f"episode {spec.episode!r} does not exist in this namespace")
    ep_spec = EpisodeSpec.model_validate(episode["spec"])
    ep_status = status_of(EpisodeStatus, episode.get("status"))
    if spec.purpose == "score" and ep_status.scoring_job != job["metadata"]["name"]:
        return Rejection(cond.INVALID_JOB, "score jobs are created only by the operator")
    allowed_phases = admitting_phases(spec.purpose)
    if ep_status.phase not in allowed_phases or episode["metadata"].get("deletionTimestamp"):
        return Rejection(
            cond.EPISODE_NOT_RUNNING,
            f"episode {spec.episode!r} is {ep_status.phase or 'not started'}; no new jobs",
        )
    try:
        task = get_task(ep_spec.task)
    except UnknownTaskError as exc:
        return Rejection(cond.INVALID_JOB, str(exc))
    flavors = allowed_flavors(ep_spec, task, ep_status)
    if spec.purpose != "train" and grader_flavor(ep_spec, task, ep_status) not in flavors:
        flavors.append(grader_flavor(ep_spec, task, ep_status))
    if spec.flavor not in flavors and spec.flavor in allowed_flavors(ep_spec, task):
        return Rejection(
            cond.NOT_IN_QUOTA,
            f"flavor {spec.flavor!r} is not among the flavors the namespace's BudgetQuota allows this "
            f"episode: {', '.join(flavors)}",
        )
    max_timeout = limits_in_force(ep_spec, task).max_job_timeout_seconds
    if spec.purpose == "score":
        max_timeout = max(max_timeout, spec.timeout_seconds)
    try:
        validate_against_task(spec, task, flavors, max_timeout)
    except InvalidJob as exc:
        return Rejection(cond.INVALID_JOB, str(exc))
    return task, ep_spec, flavors


def reserve_in(
    status: EpisodeStatus,
    job: str,
    amount: int,
    *,
    platform: bool,
    max_concurrent: int,
    allowed_phases: frozenset[str],
    dev_evaluation: bool = False,
    dev_limit: int | None = None,
) -> tuple[EpisodeStatus | None, Rejection | None]:
    """The ledger side of admission, run inside the Episode compare-and-swap. A devEval job is counted
    in the same write as its reservation, and refused past the task's cap (`dev_limit`)."""
    if job in status.ledger.entries:
        return None, None
    if status.phase not in allowed_phases:
        return None, Rejection(cond.EPISODE_NOT_RUNNING, f"episode is {status.phase}; no new jobs")
    if dev_evaluation and dev_limit is not None and status.dev_evaluations >= dev_limit:
        return None, Rejection(
            cond.DEV_EVALUATIONS_EXHAUSTED,
            f"this task allows {dev_limit} dev evaluations per episode; all are used",
        )
    if not platform:
        active = jobs_running(status.ledger)
        if active >= max_concurrent:
            return None, Rejection(
                cond.TOO_MANY_JOBS,
                f"{active} jobs are already running; the episode allows {max_concurrent} at once",
            )
    reservation = ledger_math.reserve(status.ledger, job, amount, platform=platform)
    if not reservation.admitted:
        return None, Rejection(cond.BUDGET_EXCEEDED, reservation.message)
    update: dict[str, Any] = {"ledger": reservation.ledger}
    if dev_evaluation:
        update["dev_evaluations"] = status.dev_evaluations + 1
    return status.model_copy(update=update), None
