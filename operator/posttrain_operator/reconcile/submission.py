"""Submission, exactly once: the idempotency key and the submission's start are in the job's status
before the backend is asked to run anything, a job found under its key is never submitted again, and
a submission that may still be in flight (the operator died while sending it) is waited out before
anything is sent again."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from graders.tasks import Task, get_task
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import (
    AgentJobSpec,
    AgentJobStatus,
    InstalledPackage,
    MountedRepo,
    status_of,
)
from posttrain_operator.api.rules import format_time
from posttrain_operator.backends.base import BACKEND_REFUSED, Backend, BackendError, Handle
from posttrain_operator.jobspec import build_request
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.finishing import finish_agentjob
from posttrain_operator.reconcile.jobs import (
    Retry,
    admitting_phases,
    adopt,
    submission_window_end,
    with_condition,
    write_job_status,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Admission:
    """A job admitted in this pass, its status not yet written: what submission needs to go on."""

    spec: AgentJobSpec
    task: Task
    status: AgentJobStatus
    message: str


async def submit_admitted(ctx: Context, job: dict[str, Any], admission: Admission) -> None:
    """Submit a job admitted in this very pass. Its key is written here for the first time, together
    with the admission, so no backend job can carry it yet: no lookup precedes the submission."""
    assert admission.status.backend
    backend = ctx.backend(admission.status.backend)
    try:
        await _submit(ctx, job, admission.spec, admission.task, admission.status, backend, admitted=admission)
    except BackendError as exc:
        await _submission_failed(ctx, job, exc)


async def resume_submission(ctx: Context, job: dict[str, Any], status: AgentJobStatus) -> None:
    """Go on with a job an earlier pass admitted (and perhaps submitted) before it was interrupted."""
    meta = job["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = AgentJobSpec.model_validate(job["spec"])
    assert status.idempotency_key and status.backend
    episode = await ctx.kube.get_episode(namespace, spec.episode)
    ep_status = status_of(EpisodeStatus, (episode or {}).get("status"))
    if episode is None or ep_status.phase not in admitting_phases(spec.purpose):
        await cancel_agentjob(
            ctx, namespace, name, cond.EPISODE_ENDED, "the episode ended before the job started"
        )
        return
    await adopt(ctx, job, episode)
    backend = ctx.backend(status.backend)
    try:
        handle = await backend.find(status.idempotency_key)
        if handle is not None:
            if status.submit_started_at:
                log.info("%s/%s: found backend job %s by its key; not submitting again", namespace, name,
                         handle.backend_job_id)  # fmt: skip
            await _record_submitted(ctx, job, status, handle)
            return
        # An earlier attempt's request may still be in flight (the operator died while it was sent):
        # it could create the job after this lookup. Wait out that window, then look again.
        in_flight_until = submission_window_end(ctx, status)
        if in_flight_until is not None and ctx.clock() < in_flight_until:
            remaining = (in_flight_until - ctx.clock()).total_seconds()
            wait = min(remaining, ctx.settings.submission_recheck_seconds)
            raise Retry(f"an earlier submission may still be in flight; looking again in {wait:.0f}s", wait)
        task = get_task(EpisodeSpec.model_validate(episode["spec"]).task)
        await _submit(ctx, job, spec, task, status, backend)
    except BackendError as exc:
        await _submission_failed(ctx, job, exc)


async def _submit(
    ctx: Context,
    job: dict[str, Any],
    spec: AgentJobSpec,
    task: Task,
    status: AgentJobStatus,
    backend: Backend,
    *,
    admitted: Admission | None = None,
) -> None:
    """Record the submission's start, then submit. A new admission is recorded in the same write."""
    meta = job["metadata"]
    request = build_request(spec=spec, task=task, namespace=meta["namespace"], job_name=meta["name"],
                            uid=meta["uid"], network=status.network or "unix",
                            environment_images=ctx.settings.environment_images)  # fmt: skip
    mounts = [MountedRepo(mount=r.mount_path.rsplit("/", 1)[-1], repo=r.repo_id, revision=r.revision)
              for r in request.repos]  # fmt: skip
    image = request.image or ctx.settings.launcher_image(backend.name)
    status = status.model_copy(
        update={"submit_started_at": format_time(ctx.clock()), "image": image, "mounts": mounts}
    )
    await write_job_status(ctx, job, status)
    if admitted is not None:
        ctx.emit(job, "Normal", "Admitted", admitted.message)
    handle = await backend.submit(request)
    await _record_submitted(ctx, job, status, handle)


async def _record_submitted(
    ctx: Context, job: dict[str, Any], status: AgentJobStatus, handle: Handle
) -> None:
    installed = [InstalledPackage(name=p.name, version=p.version, sha256=p.sha256) for p in handle.packages]
    update = {"phase": "Running", "backend_job_id": handle.backend_job_id, "backend_stage": "pending"}
    status = status.model_copy(update={**update, "packages": installed})
    message = f"backend job {handle.backend_job_id}"
    status = with_condition(ctx, job, status, cond.SUBMITTED, True, "Submitted", message)
    await write_job_status(ctx, job, status)
    ctx.emit(job, "Normal", "Submitted", message)


async def _submission_failed(ctx: Context, job: dict[str, Any], exc: BackendError) -> None:
    """A transient failure retries the pass (which looks the job up first); a permanent one fails it."""
    if exc.transient:
        raise Retry(f"submission failed, will look the job up and retry: {exc}") from exc
    meta = job["metadata"]
    backend = job.get("status", {}).get("backend") or ""
    ctx.note_failure(backend, exc.reason, str(exc))
    # A refused token says so; any other refusal is the submission's own.
    reason = cond.SUBMISSION_FAILED if exc.reason == BACKEND_REFUSED else exc.reason
    await finish_agentjob(ctx, meta["namespace"], meta["name"], "Failed", reason, str(exc), None)
