"""Submission, exactly once: the idempotency key is in the job's status before any backend call,
`find(key)` always precedes `submit`, and a submission that may still be in flight (the operator died
while sending it) is waited out before anything is sent again."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from graders.registry import get_task
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import AgentJobSpec, AgentJobStatus, EpisodeSpec, EpisodeStatus, status_of
from posttrain_operator.api.rules import format_time, parse_time
from posttrain_operator.backends.base import BackendError
from posttrain_operator.jobspec import build_request
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.finishing import finish_agentjob
from posttrain_operator.reconcile.jobs import Retry, admitting_phases, with_condition, write_job_status

log = logging.getLogger(__name__)


async def submit_once(ctx: Context, job: dict[str, Any], status: AgentJobStatus) -> None:
    meta = job["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = AgentJobSpec.model_validate(job["spec"])
    assert status.idempotency_key and status.backend
    episode = await ctx.kube.get_episode(namespace, spec.episode)
    ep_status = status_of(EpisodeStatus, (episode or {}).get("status"))
    still_wanted = episode is not None and (ep_status.phase in admitting_phases(spec.purpose))
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
            await write_job_status(ctx, job, status)
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
    status = with_condition(
        ctx, job, status, cond.SUBMITTED, True, "Submitted", f"backend job {handle.backend_job_id}"
    )
    await write_job_status(ctx, job, status)
    ctx.emit(job, "Normal", "Submitted", f"backend job {handle.backend_job_id}")


def submission_window_end(ctx: Context, status: AgentJobStatus) -> datetime | None:
    """Until when a submission begun at `submitStartedAt` may still reach the backend."""
    started = parse_time(status.submit_started_at)
    if started is None:
        return None
    return started + timedelta(seconds=ctx.settings.submission_window_seconds)
