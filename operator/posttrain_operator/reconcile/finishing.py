"""Finishing: move a job to a terminal phase, settle its real cost on the Episode's ledger, list its
artifacts, and read a grader job's result file (never its logs)."""

from __future__ import annotations

import contextlib
import json
import logging
from decimal import Decimal
from typing import Any

from graders.integrity.policy import Finding
from graders.result import GraderResult
from graders.tasks import RESULT_FILE
from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EgressCounts, EpisodeStatus
from posttrain_operator.api.models import (
    MAX_ARTIFACTS,
    TERMINAL_JOB_PHASES,
    AgentJobSpec,
    AgentJobStatus,
    Artifact,
    GradeResult,
    IntegrityFinding,
    JobRuntime,
    ScoreInterval,
    status_of,
)
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.rules import format_time
from posttrain_operator.backends.base import BackendError, RemoteStatus
from posttrain_operator.jobspec import output_prefix
from posttrain_operator.metrics import spend_labels
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.jobs import with_condition, write_job_status
from posttrain_operator.reconcile.orphan_records import without_orphan
from posttrain_operator.reconcile.quotas import settle_on_quota

log = logging.getLogger(__name__)

# The Event an Episode gets when it settles the entry of a job deleted without being settled.
SETTLED_AT_RESERVATION = "SettledAtReservation"


def announce_settled_at_reservation(
    ctx: Context, episode: dict[str, Any], settled: ledger_math.Settlement
) -> None:
    """Count and announce entries settled at their reservation, the jobs having been deleted without
    the operator settling them (their finalizer removed by hand): their real cost is unknown."""
    ctx.metrics.count_settled(spend_labels(episode), settled.agent, settled.platform)
    message = (
        f"settled {', '.join(settled.jobs)} at the reservation (${micro_to_usd(settled.agent)}): deleted "
        "without the operator settling them (finalizer removed by hand), so their real cost is unknown"
    )
    ctx.emit(episode, "Warning", SETTLED_AT_RESERVATION, message)


def format_score(score: float) -> str:
    """A decimal string with at most six decimals and no float noise: 1.0 -> '1', 0.955 -> '0.955'."""
    text = format(Decimal(repr(round(score, 6))).normalize(), "f")
    return text


async def grade(ctx: Context, backend_name: str, prefix: str) -> GradeResult:
    backend = ctx.backend(backend_name)
    try:
        raw = await backend.read_artifact(prefix, RESULT_FILE, ctx.settings.max_artifact_bytes)
        result = GraderResult.model_validate(json.loads(raw))
    except (FileNotFoundError, BackendError, ValueError) as exc:
        return GradeResult(status="error", reason=f"no valid {RESULT_FILE}: {exc}"[:4096])
    interval = None
    if result.interval is not None:
        interval = ScoreInterval(low=format_score(result.interval[0]), high=format_score(result.interval[1]))
    return GradeResult(
        status=result.status,
        score=format_score(result.score),
        interval=interval,
        n=result.n,
        reason=result.reason,
        grader_version=result.grader_version,
        findings=[api_finding(f) for f in result.findings] or None,
    )


def api_finding(finding: Finding) -> IntegrityFinding:
    figures = {key: str(value) for key, value in finding.figures.items()}
    return IntegrityFinding(
        check=finding.check,
        verdict=finding.verdict,
        summary=finding.summary,
        where=finding.where,
        figures=figures,
    )


async def finish_agentjob(
    ctx: Context,
    namespace: str,
    name: str,
    phase: str,
    reason: str,
    message: str,
    remote: RemoteStatus | None,
) -> None:
    """Move a job to a terminal phase: settle its cost on the Episode, then record it on the job."""
    job = await ctx.kube.get_agentjob(namespace, name)
    if job is None:
        return
    status = status_of(AgentJobStatus, job.get("status"))
    if status.phase in TERMINAL_JOB_PHASES:
        return
    orphaned = status.phase == "Orphaned"
    spec = AgentJobSpec.model_validate(job["spec"])
    seconds = ledger_math.billed_seconds(remote.started_at, remote.finished_at) if remote else 0
    cost = 0
    if seconds and status.backend:
        cost = ledger_math.cost_for(await ctx.backend(status.backend).price(spec.flavor), seconds)
    egress = remote.egress_verified if remote else None
    charged = await _settle(ctx, namespace, spec.episode, name, cost, egress)
    if spec.purpose == "score":
        charged = 0  # platform spend: never the agent's
    update: dict[str, Any] = {
        "phase": phase,
        "reason": reason,
        "message": message[:4096],
        "reserved_micro_usd": 0,
        "reserved_usd": "0.00",
        "settled_micro_usd": charged,
        "spent_usd": micro_to_usd(charged),
        "billed_seconds": seconds,
        **_seen_by_backend(ctx, remote),
    }
    if status.backend and status.backend_job_id and phase in ("Succeeded", "Failed"):
        update |= await _outputs(ctx, status.backend, output_prefix(namespace, spec.episode, name), spec,
                                 graded=phase == "Succeeded")  # fmt: skip
    status = status.model_copy(update=update)
    status = with_condition(ctx, job, status, cond.COMPLETE, phase == "Succeeded", reason, message)
    status = with_condition(ctx, job, status, cond.FINISHED, True, reason, message)
    if remote is not None and remote.egress_verified is not None:
        # The mode is the operator's own record (the job could rewrite its launcher's report).
        said = f"{remote.egress_message}; job network {status.network or 'unix'}"
        status = with_condition(
            ctx,
            job,
            status,
            cond.EGRESS_VERIFIED,
            remote.egress_verified,
            cond.PROBES_CLOSED if remote.egress_verified else cond.EGRESS_OPEN,
            said if remote.egress_verified else remote.egress_message,
        )
    await write_job_status(ctx, job, status)
    if orphaned:
        await unlist_orphan(ctx, namespace, spec.episode, name)
    ctx.emit(job, "Normal" if phase in ("Succeeded", "Cancelled") else "Warning", reason, message)


async def unlist_orphan(ctx: Context, namespace: str, episode: str, name: str) -> None:
    """`name` off its Episode's orphan list, once the job's terminal status is written. Listed until
    then, an orphan whose settle went through and whose job write did not (the operator stopped, the
    API server went away) is still the collector's to finish; unlisted with the settle, it was no
    one's, and stayed Orphaned."""

    def unlisted(body: dict[str, Any], current: EpisodeStatus) -> tuple[EpisodeStatus | None, None]:
        return without_orphan(ctx, body, current, name), None

    with contextlib.suppress(LookupError):  # the Episode is gone: no list to leave
        await ctx.kube.update_episode_status(namespace, episode, unlisted)


async def release_reservation(ctx: Context, namespace: str, episode: str, name: str) -> None:
    """Settle `name` at nothing on its Episode and its namespace's quota, for a job refused after an
    earlier pass reserved for it; a job with no entry changes nothing."""
    await _settle(ctx, namespace, episode, name, 0)


async def _settle(
    ctx: Context, namespace: str, episode: str, name: str, cost: int, egress: bool | None = None
) -> int:
    """Release the job's reservation and charge `cost` (one compare-and-swap, which also counts its
    egress check); returns what the agent was charged. An orphan stays listed (see `unlist_orphan`)."""

    def settle(
        body: dict[str, Any], current: EpisodeStatus
    ) -> tuple[EpisodeStatus | None, ledger_math.Settlement]:
        new, settled = current, ledger_math.Settlement(current.ledger, charged=cost)
        if name in current.ledger.entries or cost:
            settled = ledger_math.settle(current.ledger, name, cost)
            if settled.changed:
                new = new.model_copy(update={"ledger": settled.ledger})
                if egress is not None:  # once per job: only with the ledger entry it settles
                    counts = current.egress or EgressCounts()
                    field = "verified" if egress else "open"
                    counts = counts.model_copy(update={field: getattr(counts, field) + 1})
                    new = new.model_copy(update={"egress": counts})
        return (None if new is current else new), settled

    try:
        update = await ctx.kube.update_episode_status(namespace, episode, settle)
    except LookupError:
        log.info("episode of %s/%s is gone; nothing to settle on it", namespace, name)
        await settle_on_quota(ctx, namespace, name, cost)
        return cost
    if update.written:
        ctx.metrics.count_settled(spend_labels(update.body), update.result.agent, update.result.platform)
    await settle_on_quota(ctx, namespace, name, cost)  # after the Episode: its ledger is the record
    return update.result.charged


def _seen_by_backend(ctx: Context, remote: RemoteStatus | None) -> dict[str, Any]:
    if remote is None:
        return {}
    seen: dict[str, Any] = {
        "backend_stage": remote.raw_stage or remote.stage,
        "started_at": format_time(remote.started_at) if remote.started_at else None,
        "finished_at": format_time(remote.finished_at or ctx.clock()),
    }
    if remote.exit_code is not None:
        seen["exit_code"] = remote.exit_code
    if remote.runtime_class is not None:
        seen["runtime"] = JobRuntime(runtime_class=remote.runtime_class, kernel=remote.kernel[:256] or None)
    return seen


async def _outputs(
    ctx: Context, backend: str, prefix: str, spec: AgentJobSpec, *, graded: bool
) -> dict[str, Any]:
    """The job's artifacts, and a grader job's result when it succeeded."""
    found: dict[str, Any] = {}
    try:
        listed = await ctx.backend(backend).artifacts(prefix)
        found["artifacts"] = [Artifact(path=a.path, size=a.size) for a in listed[:MAX_ARTIFACTS]]
    except BackendError as exc:
        log.warning("listing artifacts under %s failed: %s", prefix, exc)
    if graded and spec.purpose in ("devEval", "score"):
        found["result"] = await grade(ctx, backend, prefix)
    return found
