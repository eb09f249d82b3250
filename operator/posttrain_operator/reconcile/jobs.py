"""What every AgentJob reconciler shares: the retry signal, the job's backend handle, and the one
way its status is written."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from posttrain_operator.api import provenance
from posttrain_operator.api.models import TERMINAL_JOB_PHASES, AgentJobStatus, status_of
from posttrain_operator.api.rules import EPISODE_LABEL, episode_owner, parse_time
from posttrain_operator.backends.base import Handle
from posttrain_operator.jobspec import output_prefix
from posttrain_operator.reconcile.context import Context


def admitting_phases(purpose: str) -> frozenset[str]:
    """Episode phases in which a job may be admitted and submitted: the operator's score job is
    admitted while the Episode is Scoring too; every other job only while it is Running."""
    return frozenset({"Running", "Scoring"}) if purpose == "score" else frozenset({"Running"})


class Retry(Exception):
    """A transient failure: the handler should run again after `delay` seconds."""

    def __init__(self, message: str, delay: float = 5.0) -> None:
        super().__init__(message)
        self.delay = delay


def handle_of(job: dict[str, Any], status: AgentJobStatus) -> Handle | None:
    if not status.backend_job_id:
        return None
    spec = job["spec"]
    return Handle(
        status.backend_job_id,
        output_prefix(job["metadata"]["namespace"], spec["episode"], job["metadata"]["name"]),
    )


async def write_job_status(ctx: Context, job: dict[str, Any], status: AgentJobStatus) -> None:
    """One merge patch of the job's status; `job` is updated to what the API server wrote. A job
    becoming terminal is recorded in its Episode's provenance first, so no terminal job goes
    unrecorded (a second write after a crash finds the record there)."""
    meta = job["metadata"]
    if status.phase in TERMINAL_JOB_PHASES:
        final = status_of(AgentJobStatus, {**(job.get("status") or {}), **status.patch()})
        await record_job(ctx, job, final)
    written = await ctx.kube.patch_agentjob_status(meta["namespace"], meta["name"], status)
    job["status"] = written.get("status", {})


async def adopt(ctx: Context, job: dict[str, Any], episode: dict[str, Any]) -> None:
    """Owned by its Episode (deleting that garbage-collects the job, after our finalizer cancels it),
    and labelled with it. Skipped when the job was created so (`new_job_metadata`)."""
    meta = job["metadata"]
    owners = meta.get("ownerReferences") or []
    owner = episode_owner(episode, blocking=True)
    owned = any(o.get("uid") == owner["uid"] for o in owners)
    if owned and (meta.get("labels") or {}).get(EPISODE_LABEL) == owner["name"]:
        return
    patch = {
        "metadata": {
            "labels": {EPISODE_LABEL: owner["name"]},
            "ownerReferences": owners if owned else [*owners, owner],
        }
    }
    written = await ctx.kube.patch_agentjob(meta["namespace"], meta["name"], patch)
    meta["ownerReferences"] = written["metadata"].get("ownerReferences")


async def record_job(ctx: Context, job: dict[str, Any], final: AgentJobStatus) -> None:
    meta = job["metadata"]
    episode = job["spec"]["episode"]
    owners = [o for o in meta.get("ownerReferences") or [] if o.get("kind") == "Episode"]
    owner = {k: v for k, v in owners[0].items() if k != "blockOwnerDeletion"} if owners else None
    spec = provenance.ProvenanceSpec(
        format=provenance.FORMAT, episode=episode, writer="operator", job=provenance.job_entry(job, final)
    )
    name = provenance.job_record_name(meta["name"])
    await ctx.kube.append_provenance(meta["namespace"], provenance.record(name, spec, owner))


def with_condition(
    ctx: Context, job: dict[str, Any], status: AgentJobStatus, type_: str, ok: bool, reason: str, message: str
) -> AgentJobStatus:
    conditions, _ = ctx.set_condition(job, status.conditions, type_, ok, reason, message)
    return status.model_copy(
        update={"conditions": conditions, "observed_generation": job["metadata"].get("generation")}
    )


def submission_window_end(ctx: Context, status: AgentJobStatus) -> datetime | None:
    """Until when a submission begun at `submitStartedAt` may still reach the backend: a job not
    found by its key before then may yet be created by a request still in flight."""
    started = parse_time(status.submit_started_at)
    if started is None:
        return None
    return started + timedelta(seconds=ctx.settings.submission_window_seconds)
