"""Batched status polling: one backend call per poll for every running job of that backend.

The set of running jobs is kept in memory from the AgentJob watch (`ActiveJobs.observe`), so a poll
costs no Kubernetes list either. Transitions are written to each job as they happen.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import AgentJobStatus, status_of
from posttrain_operator.api.rules import format_time, parse_time
from posttrain_operator.backends.base import BackendError, Handle, RemoteStatus
from posttrain_operator.jobspec import LAUNCHER_VERDICTS, launcher_failure
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.finishing import finish_agentjob
from posttrain_operator.reconcile.jobs import handle_of

log = logging.getLogger(__name__)

# The launcher ends a job it stopped with one line: enough of the log to find it after the backend's own.
VERDICT_LOG_LINES = 10
_TERMINAL = {"succeeded": "Succeeded", "failed": "Failed", "cancelled": "Cancelled", "lost": "Failed"}


@dataclass(frozen=True)
class ActiveJob:
    namespace: str
    name: str
    backend: str
    handle: Handle
    timeout_seconds: int
    stage: str
    submitted_at: str


class ActiveJobs:
    """Running AgentJobs by (namespace, name), maintained from watch events."""

    def __init__(self) -> None:
        self.jobs: dict[tuple[str, str], ActiveJob] = {}

    def observe(self, body: dict[str, Any], deleted: bool = False) -> None:
        meta = body["metadata"]
        key = (meta["namespace"], meta["name"])
        status = status_of(AgentJobStatus, body.get("status"))
        handle = handle_of(body, status)
        if deleted or status.phase != "Running" or handle is None or status.backend is None:
            self.jobs.pop(key, None)
            return
        submitted = next((c.last_transition_time for c in status.conditions if c.type == cond.SUBMITTED), "")
        self.jobs[key] = ActiveJob(
            namespace=key[0],
            name=key[1],
            backend=status.backend,
            handle=handle,
            timeout_seconds=int(body["spec"]["timeoutSeconds"]),
            stage=status.backend_stage or "",
            submitted_at=status.started_at or submitted,
        )

    def by_backend(self) -> dict[str, list[ActiveJob]]:
        grouped: dict[str, list[ActiveJob]] = {}
        for job in self.jobs.values():
            grouped.setdefault(job.backend, []).append(job)
        return grouped


async def _launcher_verdict(ctx: Context, job: ActiveJob, remote: RemoteStatus) -> tuple[str, str] | None:
    """The launcher's named cause of a failure, read from the end of the job's log (one backend call,
    and only for the exit codes the launcher uses itself)."""
    if remote.exit_code not in LAUNCHER_VERDICTS:
        return None
    try:
        last = await ctx.backend(job.backend).logs(job.handle, VERDICT_LOG_LINES)
    except BackendError as exc:
        log.info("%s/%s: no launcher verdict, its log is unreadable: %s", job.namespace, job.name, exc)
        return None
    return launcher_failure(remote.exit_code, last)


async def _apply(ctx: Context, job: ActiveJob, remote: RemoteStatus) -> None:
    async with ctx.locks("agentjob", job.namespace, job.name):
        if remote.stage in _TERMINAL:
            reason = {
                "succeeded": "Completed",
                "failed": cond.JOB_FAILED,
                "cancelled": "CancelledOnBackend",
                "lost": cond.BACKEND_LOST,
            }[remote.stage]
            message = (
                remote.message
                or f"backend job {job.handle.backend_job_id} {remote.raw_stage or remote.stage}"
            )
            named = await _launcher_verdict(ctx, job, remote) if remote.stage == "failed" else None
            if named is not None:
                reason, message = named[0], f"{named[1]} [{message}]"
            await finish_agentjob(
                ctx, job.namespace, job.name, _TERMINAL[remote.stage], reason, message, remote
            )
            return
        started = remote.started_at
        deadline_from = started or parse_time(job.submitted_at)
        if deadline_from is not None:
            limit = timedelta(seconds=job.timeout_seconds + ctx.settings.job_deadline_grace_seconds)
            if ctx.clock() - deadline_from > limit:
                await cancel_agentjob(
                    ctx,
                    job.namespace,
                    job.name,
                    cond.DEADLINE_EXCEEDED,
                    f"still {remote.stage} {job.timeout_seconds}s after it started; cancelled",
                )
                return
        if remote.raw_stage and remote.raw_stage != job.stage:
            seen: dict[str, Any] = {"backend_stage": remote.raw_stage}
            if started is not None:
                seen["started_at"] = format_time(started)
            # Only what the poll saw: the reconcilers own every other field.
            update = AgentJobStatus(**seen)
            await ctx.kube.patch_agentjob_status(job.namespace, job.name, update, partial=True)


async def poll_once(ctx: Context, active: ActiveJobs) -> None:
    for backend_name, jobs in active.by_backend().items():
        backend = ctx.backends.get(backend_name)
        if backend is None:
            continue
        try:
            statuses = await backend.status_many([j.handle for j in jobs])
        except BackendError as exc:
            log.warning("status poll of %d %s jobs failed: %s", len(jobs), backend_name, exc)
            continue
        results = await asyncio.gather(
            *(
                _apply(ctx, job, statuses[job.handle.backend_job_id])
                for job in jobs
                if job.handle.backend_job_id in statuses
            ),
            return_exceptions=True,
        )
        for result in results:
            if isinstance(result, Exception):
                log.warning("applying a polled status failed: %r", result)


async def poll_forever(ctx: Context, active: ActiveJobs) -> None:
    while True:
        try:
            await poll_once(ctx, active)
        except Exception:
            log.exception("status poll failed")
        await asyncio.sleep(ctx.settings.poll_interval_seconds)
