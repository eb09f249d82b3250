"""Batched status polling: one backend call per pass for every running job of that backend.

The set of running jobs is kept in memory from the AgentJob watch (`ActiveJobs.observe`), so a poll
costs no Kubernetes list either. Transitions are written to each job as they happen.

A pass costs one request per page of the backend's list (HF Jobs: 50 jobs a page, so 200 requests
at 10,000 jobs), and providers count requests against a rate limit. So passes are paced by what the
last one cost (`PassPacer`), and between passes each job's deadline is kept from the local clock:
a job past its timeout is cancelled on time however far apart the passes are.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
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


@dataclass
class PassPacer:
    """When each backend's next status pass is due: `interval` after the last one, or later when its
    requests, spread at `requests_per_minute`, need longer (the pass's cost is measured, not guessed:
    page sizes are the provider's)."""

    interval: float
    requests_per_minute: float
    clock: Callable[[], float] = time.monotonic
    next_pass: dict[str, float] = field(default_factory=dict)

    def due(self, backend: str) -> bool:
        return self.clock() >= self.next_pass.get(backend, 0.0)

    def spent(self, backend: str, requests: int, started: float) -> float:
        """Record a pass that began at `started` and sent `requests`; returns the gap to the next."""
        gap = max(self.interval, requests * 60.0 / self.requests_per_minute)
        self.next_pass[backend] = started + gap
        return gap


def _overdue(ctx: Context, job: ActiveJob, started: datetime | None, stage: str) -> str | None:
    """Why the job must be cancelled now, if it ran past its timeout and the grace."""
    deadline_from = started or parse_time(job.submitted_at)
    if deadline_from is None:
        return None
    limit = timedelta(seconds=job.timeout_seconds + ctx.settings.job_deadline_grace_seconds)
    if ctx.clock() - deadline_from <= limit:
        return None
    return f"still {stage} {job.timeout_seconds}s after it started; cancelled"


async def _cancel_overdue(ctx: Context, job: ActiveJob, message: str) -> None:
    await cancel_agentjob(ctx, job.namespace, job.name, cond.DEADLINE_EXCEEDED, message)


async def _cancel_if_overdue(ctx: Context, job: ActiveJob, message: str) -> None:
    async with ctx.locks("agentjob", job.namespace, job.name):
        await _cancel_overdue(ctx, job, message)


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
        overdue = _overdue(ctx, job, started, remote.stage)
        if overdue is not None:
            await _cancel_overdue(ctx, job, overdue)
            return
        if remote.raw_stage and remote.raw_stage != job.stage:
            seen: dict[str, Any] = {"backend_stage": remote.raw_stage}
            if started is not None:
                seen["started_at"] = format_time(started)
            # Only what the poll saw: the reconcilers own every other field.
            update = AgentJobStatus(**seen)
            await ctx.kube.patch_agentjob_status(job.namespace, job.name, update, partial=True)


async def _gathered(what: str, calls: Sequence[Awaitable[None]]) -> None:
    for result in await asyncio.gather(*calls, return_exceptions=True):
        if isinstance(result, Exception):
            log.warning("%s failed: %r", what, result)


async def _status_pass(ctx: Context, backend_name: str, jobs: list[ActiveJob], pacer: PassPacer) -> None:
    backend = ctx.backends[backend_name]
    started, sent_before = pacer.clock(), backend.stats.http_requests
    try:
        statuses = await backend.status_many([j.handle for j in jobs])
    except BackendError as exc:
        log.warning("status poll of %d %s jobs failed: %s", len(jobs), backend_name, exc)
        return
    finally:
        gap = pacer.spent(backend_name, backend.stats.http_requests - sent_before, started)
    if gap > pacer.interval:
        log.info("%s: %d jobs cost a pass of %d requests; next pass in %.0f s", backend_name, len(jobs),
                 backend.stats.http_requests - sent_before, gap)  # fmt: skip
    calls = [_apply(ctx, job, statuses[job.handle.backend_job_id]) for job in jobs
             if job.handle.backend_job_id in statuses]  # fmt: skip
    await _gathered("applying a polled status", calls)
    unread = [job for job in jobs if job.handle.backend_job_id not in statuses]
    if unread:
        log.info("%s: %d of %d jobs unread this pass", backend_name, len(unread), len(jobs))
        await _keep_deadlines(ctx, unread)


async def _keep_deadlines(ctx: Context, jobs: list[ActiveJob]) -> None:
    """Between passes: cancel what the local clock says ran out (started_at as the last pass saw it)."""
    calls = []
    for job in jobs:
        overdue = _overdue(ctx, job, None, job.stage or "active")
        if overdue is not None:
            calls.append(_cancel_if_overdue(ctx, job, overdue))
    await _gathered("cancelling an overdue job", calls)


async def poll_once(ctx: Context, active: ActiveJobs, pacer: PassPacer) -> None:
    for backend_name, jobs in active.by_backend().items():
        if backend_name not in ctx.backends:
            continue
        if pacer.due(backend_name):
            await _status_pass(ctx, backend_name, jobs, pacer)
        else:
            await _keep_deadlines(ctx, jobs)


async def poll_forever(ctx: Context, active: ActiveJobs) -> None:
    settings = ctx.settings
    pacer = PassPacer(settings.poll_interval_seconds, settings.poll_requests_per_minute)
    while True:
        try:
            await poll_once(ctx, active, pacer)
        except Exception:
            log.exception("status poll failed")
        await asyncio.sleep(settings.poll_interval_seconds)
