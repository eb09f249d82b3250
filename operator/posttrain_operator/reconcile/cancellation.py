"""Cancellation: stop a job on its backend and finish it once the backend confirms; a cancellation the
backend does not confirm leaves the job Orphaned, listed on its Episode, with its reservation held."""

from __future__ import annotations

import contextlib
import logging
from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.api.models import TERMINAL_JOB_PHASES, AgentJobSpec, AgentJobStatus, status_of
from posttrain_operator.backends.base import BackendError
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.finishing import finish_agentjob
from posttrain_operator.reconcile.jobs import handle_of, submission_window_end, write_job_status
from posttrain_operator.reconcile.orphan_records import with_orphan

log = logging.getLogger(__name__)


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
            in_flight_until = submission_window_end(ctx, status)
            if handle is None and in_flight_until is not None and ctx.clock() < in_flight_until:
                # A submission request may still create the job after this lookup: settling it at
                # nothing now could leave a job running and billing unseen. Not confirmed yet.
                log.info("%s/%s: cancel waits for a submission still in flight", namespace, name)
                return False
        if handle is None or backend is None:
            await finish_agentjob(ctx, namespace, name, "Cancelled", reason, message, None)
            return True
        confirmed = await backend.cancel(handle)
        remote = (await backend.status_many([handle])).get(handle.backend_job_id) if confirmed else None
        if confirmed and remote is None:
            # Gone, but its run times are unread: settling now would bill it at nothing.
            confirmed, message = False, f"{message}; its run times are unread"
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
        await write_job_status(ctx, job, orphan)
        ctx.emit(job, "Warning", cond.CANCEL_UNCONFIRMED, orphan.message or "")
    spec = AgentJobSpec.model_validate(job["spec"])
    backend_job_id = handle.backend_job_id

    def add_orphan(episode: dict[str, Any], current: EpisodeStatus) -> tuple[EpisodeStatus | None, None]:
        return with_orphan(ctx, episode, current, name, backend_job_id), None

    with contextlib.suppress(LookupError):  # the episode is gone: nothing to block
        await ctx.kube.update_episode_status(namespace, spec.episode, add_orphan)
    return False


async def cancel_all(
    ctx: Context,
    body: dict[str, Any],
    reason: str,
    message: str,
    *,
    keep: str | None = None,
    jobs: list[dict[str, Any]] | None = None,
) -> bool:
    """Cancel every non-terminal job of the episode (`jobs`: as the caller just listed them); True
    when every cancellation is confirmed."""
    meta = body["metadata"]
    if jobs is None:
        jobs = await ctx.kube.list_agentjobs(meta["namespace"], meta["name"])
    confirmed = True
    for job in jobs:
        job_name = job["metadata"]["name"]
        if job_name == keep or status_of(AgentJobStatus, job.get("status")).phase in TERMINAL_JOB_PHASES:
            continue
        async with ctx.locks("agentjob", meta["namespace"], job_name):
            confirmed = await cancel_agentjob(ctx, meta["namespace"], job_name, reason, message) and confirmed
    return confirmed
