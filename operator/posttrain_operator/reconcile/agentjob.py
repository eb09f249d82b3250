"""AgentJob lifecycle: admit against the ledger, submit exactly once, settle, cancel.

Every step is idempotent and resumable from the job's status alone: the ledger entry is keyed by
job name, the idempotency key is written before any backend call, and `find(key)` always precedes
`submit`. A crash at any point therefore leads, on restart, to the same job and the same ledger.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

from pydantic import ValidationError

from graders.registry import RESULT_FILE, Task, UnknownTaskError, get_task
from graders.result import GraderResult
from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import (
    MAX_ARTIFACTS,
    TERMINAL_JOB_PHASES,
    AgentJobSpec,
    AgentJobStatus,
    Artifact,
    EpisodeSpec,
    EpisodeStatus,
    GradeResult,
    OrphanedJob,
    status_of,
)
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.rules import (
    EPISODE_LABEL,
    allowed_flavors,
    format_time,
    jobs_running,
    limits_in_force,
    parse_time,
)
from posttrain_operator.backends.base import BackendError, Handle, RemoteStatus, UnknownFlavor
from posttrain_operator.jobspec import (
    InvalidJob,
    build_request,
    idempotency_key,
    output_prefix,
    validate_against_task,
)
from posttrain_operator.reconcile.context import Context

log = logging.getLogger(__name__)

ADMITTING_PHASES = {"Running"}
SCORE_ADMITTING_PHASES = {"Running", "Scoring"}


class Retry(Exception):
    """A transient failure: the handler should run again after `delay` seconds."""

    def __init__(self, message: str, delay: float = 5.0) -> None:
        super().__init__(message)
        self.delay = delay


@dataclass(frozen=True)
class Rejection:
    reason: str
    message: str


def format_score(score: float) -> str:
    """A decimal string with at most six decimals and no float noise: 1.0 -> '1', 0.955 -> '0.955'."""
    text = format(Decimal(repr(round(score, 6))).normalize(), "f")
    return text


# --- pure decisions ----------------------------------------------------------------------------


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
    allowed_phases = SCORE_ADMITTING_PHASES if spec.purpose == "score" else ADMITTING_PHASES
    if ep_status.phase not in allowed_phases or episode["metadata"].get("deletionTimestamp"):
        return Rejection(
            cond.EPISODE_NOT_RUNNING,
            f"episode {spec.episode!r} is {ep_status.phase or 'not started'}; no new jobs",
        )
    try:
        task = get_task(ep_spec.task)
    except UnknownTaskError as exc:
        return Rejection(cond.INVALID_JOB, str(exc))
    flavors = allowed_flavors(ep_spec, task)
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
    allowed_phases: set[str],
) -> tuple[EpisodeStatus | None, Rejection | None]:
    """The ledger side of admission, run inside the Episode compare-and-swap."""
    if job in status.ledger.entries:
        return None, None
    if status.phase not in allowed_phases:
        return None, Rejection(cond.EPISODE_NOT_RUNNING, f"episode is {status.phase}; no new jobs")
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
    return status.model_copy(update={"ledger": reservation.ledger}), None


# --- actions -----------------------------------------------------------------------------------


async def _write_status(ctx: Context, job: dict[str, Any], status: AgentJobStatus) -> dict[str, Any]:
    meta = job["metadata"]
    written = await ctx.kube.patch_agentjob_status(meta["namespace"], meta["name"], status.wire())
    job["status"] = written.get("status", {})
    return written


def _with_condition(
    ctx: Context, job: dict[str, Any], status: AgentJobStatus, type_: str, ok: bool, reason: str, message: str
) -> AgentJobStatus:
    conditions = ctx.set_condition(job, status.conditions, type_, ok, reason, message)
    return status.model_copy(
        update={"conditions": conditions, "observed_generation": job["metadata"].get("generation")}
    )


async def _reject(ctx: Context, job: dict[str, Any], status: AgentJobStatus, rejection: Rejection) -> None:
    status = status.model_copy(
        update={"phase": "Rejected", "reason": rejection.reason, "message": rejection.message}
    )
    status = _with_condition(ctx, job, status, cond.ADMITTED, False, rejection.reason, rejection.message)
    await _write_status(ctx, job, status)
    ctx.emit(job, "Warning", rejection.reason, rejection.message)


async def reconcile_agentjob(ctx: Context, namespace: str, name: str) -> None:
    async with ctx.locks("agentjob", namespace, name):
        job = await ctx.kube.get_agentjob(namespace, name)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        status = status_of(AgentJobStatus, job.get("status"))
        if status.phase in (None, "Pending"):
            status = await _admit(ctx, job, status)
        if status.phase == "Admitted":
            await _submit(ctx, job, status)


async def _admit(ctx: Context, job: dict[str, Any], status: AgentJobStatus) -> AgentJobStatus:
    meta = job["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    try:
        spec = AgentJobSpec.model_validate(job["spec"])
    except ValidationError as exc:
        await _reject(ctx, job, status, Rejection(cond.INVALID_JOB, f"invalid spec: {exc}"))
        return status
    episode = await ctx.kube.get_episode(namespace, spec.episode)
    decided = decide_admission(job, spec, episode)
    if isinstance(decided, Rejection):
        await _reject(ctx, job, status, decided)
        return status
    task, ep_spec, _ = decided
    assert episode is not None
    backend = ctx.backend(ep_spec.backend)
    try:
        price = await backend.price(spec.flavor)
    except UnknownFlavor as exc:
        await _reject(ctx, job, status, Rejection(cond.INVALID_JOB, str(exc)))
        return status
    except BackendError as exc:
        raise Retry(f"price lookup failed: {exc}") from exc
    amount = ledger_math.reservation_for(price, spec.timeout_seconds)
    platform = spec.purpose == "score"
    max_concurrent = limits_in_force(ep_spec, task).max_concurrent_jobs
    phases = SCORE_ADMITTING_PHASES if platform else ADMITTING_PHASES
    refused: list[Rejection] = []

    def mutate(_: dict[str, Any], current: EpisodeStatus) -> EpisodeStatus | None:
        refused.clear()
        new, rejection = reserve_in(
            current, name, amount, platform=platform, max_concurrent=max_concurrent, allowed_phases=phases
        )
        if rejection:
            refused.append(rejection)
        return new

    await ctx.kube.update_episode_status(namespace, spec.episode, mutate)
    if refused:
        await _reject(ctx, job, status, refused[0])
        return status

    # Owned by the Episode: deleting it garbage-collects the job (after our finalizer cancels it).
    owner = {
        "apiVersion": episode["apiVersion"],
        "kind": "Episode",
        "name": spec.episode,
        "uid": episode["metadata"]["uid"],
        "blockOwnerDeletion": True,
    }
    if not any(o.get("uid") == owner["uid"] for o in meta.get("ownerReferences") or []):
        await ctx.kube.patch_agentjob(
            namespace,
            name,
            {
                "metadata": {
                    "labels": {EPISODE_LABEL: spec.episode},
                    "ownerReferences": [*(meta.get("ownerReferences") or []), owner],
                }
            },
        )
    reserved = 0 if platform else amount
    message = f"reserved ${micro_to_usd(reserved)} at ${micro_to_usd(price)}/min for {spec.timeout_seconds}s"
    status = status.model_copy(
        update={
            "phase": "Admitted",
            "reason": None,
            "message": message,
            "backend": ep_spec.backend,
            "idempotency_key": idempotency_key(meta["uid"]),
            "reserved_micro_usd": reserved,
            "reserved_usd": micro_to_usd(reserved),
        }
    )
    status = _with_condition(ctx, job, status, cond.ADMITTED, True, "Reserved", message)
    await _write_status(ctx, job, status)
    ctx.emit(job, "Normal", "Admitted", message)
    return status


async def _submit(ctx: Context, job: dict[str, Any], status: AgentJobStatus) -> None:
    meta = job["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = AgentJobSpec.model_validate(job["spec"])
    assert status.idempotency_key and status.backend
    episode = await ctx.kube.get_episode(namespace, spec.episode)
    ep_status = status_of(EpisodeStatus, (episode or {}).get("status"))
    still_wanted = episode is not None and (
        ep_status.phase in (SCORE_ADMITTING_PHASES if spec.purpose == "score" else ADMITTING_PHASES)
    )
    if not still_wanted:
        await cancel_agentjob(
            ctx, namespace, name, cond.EPISODE_ENDED, "the episode ended before the job started"
        )
        return
    backend = ctx.backend(status.backend)
    try:
        handle = await backend.find(status.idempotency_key)
        if handle is None:
            # An earlier attempt's request may still be in flight (the operator died while it was
            # sent): it could create the job after this lookup. Wait out that window, then look again.
            in_flight_until = submission_window_end(ctx, status)
            if in_flight_until is not None and ctx.clock() < in_flight_until:
                remaining = (in_flight_until - ctx.clock()).total_seconds()
                wait = min(remaining, ctx.settings.submission_recheck_seconds)
                raise Retry(
                    f"an earlier submission may still be in flight; looking again in {wait:.0f}s", wait
                )
            task = get_task(EpisodeSpec.model_validate(episode["spec"]).task)  # type: ignore[index]
            request = build_request(spec=spec, task=task, namespace=namespace, job_name=name, uid=meta["uid"])
            status = status.model_copy(update={"submit_started_at": format_time(ctx.clock())})
            await _write_status(ctx, job, status)
            handle = await backend.submit(request)
        elif status.submit_started_at:
            log.info(
                "%s/%s: found backend job %s by its key; not submitting again",
                namespace,
                name,
                handle.backend_job_id,
            )
    except BackendError as exc:
        if exc.transient:
            raise Retry(f"submission failed, will look the job up and retry: {exc}") from exc
        await finish_agentjob(ctx, namespace, name, "Failed", cond.SUBMISSION_FAILED, str(exc), None)
        return
    status = status.model_copy(
        update={"phase": "Running", "backend_job_id": handle.backend_job_id, "backend_stage": "pending"}
    )
    status = _with_condition(
        ctx, job, status, cond.SUBMITTED, True, "Submitted", f"backend job {handle.backend_job_id}"
    )
    await _write_status(ctx, job, status)
    ctx.emit(job, "Normal", "Submitted", f"backend job {handle.backend_job_id}")


def submission_window_end(ctx: Context, status: AgentJobStatus) -> datetime | None:
    """Until when a submission begun at `submitStartedAt` may still reach the backend."""
    started = parse_time(status.submit_started_at)
    if started is None:
        return None
    return started + timedelta(seconds=ctx.settings.submission_window_seconds)


def handle_of(job: dict[str, Any], status: AgentJobStatus) -> Handle | None:
    if not status.backend_job_id:
        return None
    spec = job["spec"]
    return Handle(
        status.backend_job_id,
        output_prefix(job["metadata"]["namespace"], spec["episode"], job["metadata"]["name"]),
    )


async def _grade(ctx: Context, backend_name: str, prefix: str) -> GradeResult:
    backend = ctx.backend(backend_name)
    try:
        raw = await backend.read_artifact(prefix, RESULT_FILE, ctx.settings.max_artifact_bytes)
        result = GraderResult.model_validate(json.loads(raw))
    except (FileNotFoundError, BackendError, ValueError) as exc:
        return GradeResult(status="error", reason=f"no valid {RESULT_FILE}: {exc}"[:4096])
    return GradeResult(
        status=result.status,
        score=format_score(result.score),
        n=result.n,
        reason=result.reason,
        grader_version=result.grader_version,
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
    spec = AgentJobSpec.model_validate(job["spec"])
    seconds = ledger_math.billed_seconds(remote.started_at, remote.finished_at) if remote else 0
    cost = 0
    if seconds and status.backend:
        cost = ledger_math.cost_for(await ctx.backend(status.backend).price(spec.flavor), seconds)
    charged = cost

    def mutate(episode: dict[str, Any], current: EpisodeStatus) -> EpisodeStatus | None:
        nonlocal charged
        new = current
        if name in current.ledger.entries or cost:
            new_ledger, charged, changed = ledger_math.settle(current.ledger, name, cost)
            if changed:
                new = new.model_copy(update={"ledger": new_ledger})
        if any(o.name == name for o in current.orphaned_jobs):
            new = without_orphan(ctx, episode, new, name)
        return None if new is current else new

    try:
        await ctx.kube.update_episode_status(namespace, spec.episode, mutate)
    except LookupError:
        log.info("episode of %s/%s is gone; nothing to settle", namespace, name)

    update: dict[str, Any] = {
        "phase": phase,
        "reason": reason,
        "message": message[:4096],
        "reserved_micro_usd": 0,
        "reserved_usd": "0.00",
        "settled_micro_usd": charged if spec.purpose != "score" else 0,
        "spent_usd": micro_to_usd(charged if spec.purpose != "score" else 0),
        "billed_seconds": seconds,
    }
    if remote is not None:
        update["backend_stage"] = remote.raw_stage or remote.stage
        update["started_at"] = format_time(remote.started_at) if remote.started_at else None
        update["finished_at"] = format_time(remote.finished_at or ctx.clock())
    prefix = output_prefix(namespace, spec.episode, name)
    if status.backend and status.backend_job_id and phase in ("Succeeded", "Failed"):
        try:
            found = await ctx.backend(status.backend).artifacts(prefix)
            update["artifacts"] = [Artifact(path=a.path, size=a.size) for a in found[:MAX_ARTIFACTS]]
        except BackendError as exc:
            log.warning("listing artifacts of %s/%s failed: %s", namespace, name, exc)
        if spec.purpose in ("devEval", "score") and phase == "Succeeded":
            update["result"] = await _grade(ctx, status.backend, prefix)
    status = status.model_copy(update=update)
    status = _with_condition(ctx, job, status, cond.COMPLETE, phase == "Succeeded", reason, message)
    await _write_status(ctx, job, status)
    ctx.emit(job, "Normal" if phase in ("Succeeded", "Cancelled") else "Warning", reason, message)


async def cancel_agentjob(ctx: Context, namespace: str, name: str, reason: str, message: str) -> bool:
    """Cancel a job on its backend. True when it is confirmed gone (or never existed there); an
    unconfirmed cancel marks the job Orphaned and leaves its reservation in place."""
    job = await ctx.kube.get_agentjob(namespace, name)
    if job is None:
        return True
    status = status_of(AgentJobStatus, job.get("status"))
    if status.phase in TERMINAL_JOB_PHASES:
        return True
    handle = handle_of(job, status)
    backend = ctx.backend(status.backend) if status.backend else None
    try:
        if handle is None and backend is not None and status.idempotency_key:
            handle = await backend.find(status.idempotency_key)
        if handle is None or backend is None:
            await finish_agentjob(ctx, namespace, name, "Cancelled", reason, message, None)
            return True
        confirmed = await backend.cancel(handle)
        remote = (await backend.status_many([handle])).get(handle.backend_job_id) if confirmed else None
    except BackendError as exc:
        confirmed, remote = False, None
        message = f"{message}; cancel failed: {exc}"
    if confirmed:
        await finish_agentjob(ctx, namespace, name, "Cancelled", reason, message, remote)
        return True
    assert handle is not None  # no handle means nothing to cancel, which counts as confirmed
    if status.phase != "Orphaned":
        orphan = status.model_copy(
            update={
                "phase": "Orphaned",
                "reason": cond.CANCEL_UNCONFIRMED,
                "message": f"the backend did not confirm cancelling {handle.backend_job_id}; retrying",
                "backend_job_id": handle.backend_job_id,
            }
        )
        await _write_status(ctx, job, orphan)
        ctx.emit(job, "Warning", cond.CANCEL_UNCONFIRMED, orphan.message or "")
    spec = AgentJobSpec.model_validate(job["spec"])
    backend_job_id = handle.backend_job_id

    def add_orphan(episode: dict[str, Any], current: EpisodeStatus) -> EpisodeStatus | None:
        if any(o.name == name for o in current.orphaned_jobs):
            return None
        now = ctx.clock()
        entry = OrphanedJob(
            name=name,
            backend_job_id=backend_job_id,
            since=format_time(now),
            attempts=1,
            next_attempt_at=format_time(now + timedelta(seconds=ctx.settings.orphan_retry_initial_seconds)),
        )
        orphans = [*current.orphaned_jobs, entry]
        return with_orphan_condition(ctx, episode, current.model_copy(update={"orphaned_jobs": orphans}))

    with contextlib.suppress(LookupError):  # the episode is gone: nothing to block
        await ctx.kube.update_episode_status(namespace, spec.episode, add_orphan)
    return False


def with_orphan_condition(ctx: Context, episode: dict[str, Any], status: EpisodeStatus) -> EpisodeStatus:
    names = ", ".join(o.name for o in status.orphaned_jobs)
    conditions = ctx.set_condition(
        episode,
        status.conditions,
        cond.ORPHANED,
        bool(status.orphaned_jobs),
        cond.ORPHANED_JOBS if status.orphaned_jobs else "AllConfirmed",
        f"cancellation not confirmed for: {names}" if names else "every cancellation is confirmed",
    )
    return status.model_copy(update={"conditions": conditions})


def without_orphan(ctx: Context, episode: dict[str, Any], status: EpisodeStatus, name: str) -> EpisodeStatus:
    orphans = [o for o in status.orphaned_jobs if o.name != name]
    return with_orphan_condition(ctx, episode, status.model_copy(update={"orphaned_jobs": orphans}))
