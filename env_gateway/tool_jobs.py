"""What the agent's tools share: their context, and the caller's AgentJobs as the tools read, show
and create them (a job of another episode is never found; a new one is awaited until admission is
decided)."""

from __future__ import annotations

import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain_operator.api.models import TERMINAL_JOB_PHASES, AgentJobStatus, status_of
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.rules import CREATED_BY_GATEWAY, CREATED_BY_LABEL, new_job_metadata

from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeView
from env_gateway.kube import Kube, Refused
from env_gateway.schemas import JobView, ToolFailure

# Phases after which admission has been decided.
DECIDED_PHASES = frozenset({"Admitted", "Running", "Orphaned"} | TERMINAL_JOB_PHASES)


@dataclass(frozen=True)
class ToolContext:
    kube: Kube
    broker: BrokerClient
    settings: GatewaySettings
    episode: EpisodeView


def _snake(reason: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", reason).lower()


def job_view(job: dict[str, Any]) -> JobView:
    spec = job.get("spec", {})
    status = status_of(AgentJobStatus, job.get("status"))
    return JobView(
        name=job["metadata"]["name"],
        purpose=spec.get("purpose", ""),
        phase=status.phase or "Pending",
        reason=status.reason,
        message=status.message,
        flavor=spec.get("flavor"),
        timeout_seconds=spec.get("timeoutSeconds"),
        checkpoint_from=spec.get("checkpointFrom"),
        inputs_from=list(spec.get("inputsFrom") or []),
        lineage=list(status.lineage),
        installed=[f"{p.name}=={p.version}" for p in status.packages],
        network=status.network,
        reserved_usd=micro_to_usd(status.reserved_micro_usd),
        spent_usd=micro_to_usd(status.settled_micro_usd),
        exit_code=status.exit_code,
        started_at=status.started_at,
        finished_at=status.finished_at,
        artifacts=[a.model_dump() for a in status.artifacts],
        result=status.result.model_dump(exclude_none=True) if status.result else None,
        deleting=bool(job["metadata"].get("deletionTimestamp")),
    )


async def own_job(ctx: ToolContext, name: str, *, fresh: bool = False) -> dict[str, Any]:
    """The job, if it belongs to the caller's episode; the same error whether it is foreign or absent,
    so one episode learns nothing about another's jobs. `fresh`: as the API server has it now."""
    read = ctx.kube.read_agentjob if fresh else ctx.kube.get_agentjob
    job = await read(ctx.episode.namespace, name)
    spec = (job or {}).get("spec", {})
    if job is None or spec.get("episode") != ctx.episode.name or spec.get("purpose") == "score":
        raise ToolFailure("job_not_found", f"no job {name!r} in this episode", error_type="invalid_args")
    return job


def refuse_if_not_running(ctx: ToolContext) -> None:
    if ctx.episode.status.phase != "Running":
        raise ToolFailure(
            "episode_not_running",
            f"the episode is {ctx.episode.status.phase or 'Pending'}; it takes no new jobs",
        )


async def create_and_await_admission(ctx: ToolContext, body: dict[str, Any]) -> dict[str, Any]:
    ep = ctx.episode
    prefix = ep.name[:40].rstrip("-")
    body["metadata"] = new_job_metadata(
        f"{prefix}-{secrets.token_hex(4)}", ep.body, {CREATED_BY_LABEL: CREATED_BY_GATEWAY}
    )
    try:
        job = await ctx.kube.create(ep.namespace, "agentjobs", body)
    except Refused as exc:  # the CRD schema refused it: nothing was created
        raise ToolFailure("invalid_job", f"the API server refused the job: {exc.detail}") from exc
    name = job["metadata"]["name"]
    job = await wait_for_job(
        ctx, name, job, lambda j: phase_of(j) in DECIDED_PHASES, ctx.settings.submit_admission_wait_seconds
    )
    if phase_of(job) == "Rejected":
        status = status_of(AgentJobStatus, job.get("status"))
        reason = status.reason or "Rejected"
        raise ToolFailure(
            _snake(reason),
            status.message or reason,
            details={"job": name, "reason": reason, "service_spend": ep.spend().model_dump()},
        )
    return job


def phase_of(job: dict[str, Any]) -> str:
    return str((job.get("status") or {}).get("phase") or "Pending")


async def wait_for_job(
    ctx: ToolContext, name: str, job: dict[str, Any], done: Callable[[dict[str, Any]], bool], seconds: float
) -> dict[str, Any]:
    """Until `done(job)` or the timeout (woken by the mirror's watch); the newest version seen, or the
    last one if the job went away meanwhile."""
    seen = await ctx.kube.wait_for(ctx.episode.namespace, "agentjobs", name, done, seconds)
    return seen or job
