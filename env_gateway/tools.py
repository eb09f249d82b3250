"""The agent's tools. Each takes validated arguments and the caller's Episode (already authenticated
and counted by the choke point) and returns a typed result or raises ToolFailure."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from posttrain_operator.api.models import (
    API_VERSION,
    TERMINAL_JOB_PHASES,
    AgentJobSpec,
)
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.rules import (
    ENDED_PHASES,
    InvalidInputs,
    lineage_of,
)
from pydantic import BaseModel

from env_gateway.broker import BrokerError, BrokerRefused
from env_gateway.kube import Conflict, Refused
from env_gateway.schemas import (
    Args,
    ArtifactResult,
    CancelResult,
    DevEvaluateArgs,
    JobArgs,
    JobResult,
    JobsLogsArgs,
    JobsResult,
    JobsStatusArgs,
    JobsWaitArgs,
    JobView,
    LogsResult,
    NoArgs,
    ReadArtifactArgs,
    SubmitJobArgs,
    SubmitResult,
    ToolFailure,
    WaitResult,
)
from env_gateway.tool_jobs import (
    ToolContext,
    create_and_await_admission,
    job_view,
    own_job,
    phase_of,
    refuse_if_not_running,
    wait_for_job,
)

# --- the tools ---------------------------------------------------------------------------------


async def task_info(ctx: ToolContext, _: NoArgs) -> dict[str, Any]:
    ep = ctx.episode
    view = ep.task.public_view().model_dump(mode="json")
    limits = ep.limits
    view["episode"] = {
        "name": ep.name,
        "budget_usd": ep.spec.budget_usd,
        "flavors": ep.flavors,
        "grader_flavor": ep.grader_flavor,
        "max_steps": limits.max_steps,
        "max_wall_seconds": limits.max_wall_seconds,
        "max_concurrent_jobs": limits.max_concurrent_jobs,
        "max_job_timeout_seconds": limits.max_job_timeout_seconds,
        "max_wait_seconds": ctx.settings.max_wait_seconds,
        "network": ep.status.network.model_dump() if ep.status.network else None,
        "submission": ep.spec.submission.checkpoint_from if ep.spec.submission else None,
        "dev_evaluations": ep.status.dev_evaluations,
    }
    return view


async def jobs_submit(ctx: ToolContext, args: SubmitJobArgs) -> JobResult:
    refuse_if_not_running(ctx)
    ep = ctx.episode
    refused = ep.task.package_refusal(args.packages)
    if refused is not None:  # the operator refuses it too; nothing is created
        raise ToolFailure("package_not_allowed", refused, error_type="invalid_args")
    spec = {
        "episode": ep.name,
        "purpose": "train",
        "script": args.script,
        "packages": args.packages,
        "flavor": args.flavor or ep.flavors[0],
        "timeoutSeconds": args.timeout_seconds,
        "datasets": args.datasets if args.datasets is not None else sorted(ep.task.agent_datasets),
    }
    if args.inputs_from:
        spec["inputsFrom"] = args.inputs_from
        await _check_inputs(ctx, AgentJobSpec.model_validate(spec))
    job = await create_and_await_admission(ctx, {"apiVersion": API_VERSION, "kind": "AgentJob", "spec": spec})
    return JobResult(job=job_view(job))


async def _check_inputs(ctx: ToolContext, spec: AgentJobSpec) -> None:
    """Refuse, before anything is created, inputs the operator would refuse (it checks again)."""
    if len(set(spec.inputs_from)) != len(spec.inputs_from):
        raise ToolFailure("invalid_inputs_from", "inputs_from names a job twice", error_type="invalid_args")
    found = [await ctx.kube.get_agentjob(ctx.episode.namespace, name) for name in spec.inputs_from]
    try:
        lineage_of("", spec, dict(zip(spec.inputs_from, found, strict=True)))
    except InvalidInputs as exc:
        raise ToolFailure("invalid_inputs_from", str(exc), error_type="invalid_args") from exc


async def dev_evaluate(ctx: ToolContext, args: DevEvaluateArgs) -> JobResult:
    refuse_if_not_running(ctx)
    source = await own_job(ctx, args.job)
    if source["spec"].get("purpose") != "train":
        raise ToolFailure("invalid_job", f"{args.job!r} is not a train job", error_type="invalid_args")
    ep = ctx.episode
    cap = ep.task.integrity.dev_evaluations.max_calls
    if cap is not None and ep.status.dev_evaluations >= cap:  # the operator refuses it too
        raise ToolFailure(
            "dev_evaluations_exhausted",
            f"this task allows {cap} dev evaluations per episode; all {ep.status.dev_evaluations} are used",
        )
    spec = {
        "episode": ep.name,
        "purpose": "devEval",
        "flavor": ep.grader_flavor,
        "timeoutSeconds": args.timeout_seconds,
        "checkpointFrom": args.job,
    }
    job = await create_and_await_admission(ctx, {"apiVersion": API_VERSION, "kind": "AgentJob", "spec": spec})
    return JobResult(job=job_view(job))


async def jobs_status(ctx: ToolContext, args: JobsStatusArgs) -> JobsResult:
    ep = ctx.episode
    if args.job is not None:
        return JobsResult(jobs=[job_view(await own_job(ctx, args.job))])
    jobs = [
        j for j in await ctx.kube.list_agentjobs(ep.namespace, ep.name) if j["spec"].get("purpose") != "score"
    ]
    views = [job_view(j) for j in jobs]
    # A cancelled job's AgentJob is deleted (that is how jobs_cancel cancels); its ledger entry remains.
    present = {v.name for v in views}
    for name, entry in sorted(ep.status.ledger.entries.items()):
        if name not in present and not entry.platform:
            views.append(
                JobView(
                    name=name,
                    purpose="unknown",
                    phase="Cancelled" if entry.settled_micro_usd is not None else "Cancelling",
                    message="deleted (cancelled); its cost stays in the ledger",
                    reserved_usd=micro_to_usd(entry.reserved_micro_usd),
                    spent_usd=micro_to_usd(entry.settled_micro_usd or 0),
                )
            )
    views.sort(key=lambda v: v.name)
    return JobsResult(jobs=views)


async def jobs_wait(ctx: ToolContext, args: JobsWaitArgs) -> WaitResult:
    timeout = min(args.timeout_seconds, ctx.settings.max_wait_seconds)
    if args.jobs:
        return await _wait_for_any_change(ctx, args.jobs, timeout)
    ep = ctx.episode
    if args.job is None:
        body = ep.body
        if body.get("status", {}).get("phase") not in ENDED_PHASES:
            seen = await ctx.kube.wait_for(
                ep.namespace,
                "episodes",
                ep.name,
                lambda e: (e.get("status") or {}).get("phase") in ENDED_PHASES,
                timeout,
            )
            body = seen or body
        status = body.get("status") or {}
        return WaitResult(
            finished=status.get("phase") in ENDED_PHASES,
            episode_phase=status.get("phase"),
            outcome=status.get("outcome"),
            reward=status.get("reward"),
            reward_interval=_interval(status.get("rewardInterval")),
            integrity=(status.get("integrity") or {}).get("label"),
        )
    job = await own_job(ctx, args.job)
    job = await wait_for_job(ctx, args.job, job, lambda j: phase_of(j) in TERMINAL_JOB_PHASES, timeout)
    return WaitResult(finished=phase_of(job) in TERMINAL_JOB_PHASES, job=job_view(job))


def _interval(interval: dict[str, str] | None) -> list[str] | None:
    return [interval["low"], interval["high"]] if interval else None


async def _wait_for_any_change(ctx: ToolContext, names: list[str], seconds: float) -> WaitResult:
    """Until any named job is in another phase than at the start (or is gone), or all have finished."""
    names = list(dict.fromkeys(names))
    start = {name: phase_of(await own_job(ctx, name)) for name in names}

    def changed(seen: dict[str, dict[str, Any] | None]) -> list[str]:
        return [n for n in names if seen[n] is None or phase_of(seen[n] or {}) != start[n]]

    def done(seen: dict[str, dict[str, Any] | None]) -> bool:
        return bool(changed(seen)) or all(p in TERMINAL_JOB_PHASES for p in start.values())

    seen = await ctx.kube.wait_for_any(ctx.episode.namespace, "agentjobs", names, done, seconds)
    views = [job_view(job) for job in seen.values() if job is not None]
    return WaitResult(
        finished=all(v.phase in TERMINAL_JOB_PHASES for v in views) and len(views) == len(names),
        jobs=views,
        changed=changed(seen),
    )


async def jobs_logs(ctx: ToolContext, args: JobsLogsArgs) -> LogsResult:
    await own_job(ctx, args.job)
    try:
        lines, truncated = await ctx.broker.logs(ctx.episode.namespace, args.job, args.tail)
    except BrokerError as exc:
        raise ToolFailure("logs_unavailable", str(exc), error_type="transport_error") from exc
    return LogsResult(job=args.job, lines=lines, truncated=truncated)


async def jobs_read_artifact(ctx: ToolContext, args: ReadArtifactArgs) -> ArtifactResult:
    await own_job(ctx, args.job)
    try:
        found = await ctx.broker.read_artifact(ctx.episode.namespace, args.job, args.path)
    except BrokerRefused as exc:
        code = "artifact_not_found" if exc.status == 404 else "artifact_refused"
        raise ToolFailure(code, str(exc), error_type="invalid_args") from exc
    except BrokerError as exc:
        raise ToolFailure("artifacts_unavailable", str(exc), error_type="transport_error") from exc
    return ArtifactResult(job=args.job, path=found.path, size=found.size, text=found.text)


CANCEL_ATTEMPTS = 8


async def jobs_cancel(ctx: ToolContext, args: JobArgs) -> CancelResult:
    job = await own_job(ctx, args.job)
    for _ in range(CANCEL_ATTEMPTS):
        if phase_of(job) in TERMINAL_JOB_PHASES:
            return CancelResult(job=args.job, cancelling=False, message=f"already {phase_of(job)}")
        # Deleting is the cancel: the operator's finalizer stops the backend job and settles its cost
        # before the object goes; jobs_status keeps reporting it (then from the ledger). Only the job
        # as read is deleted: one that finished meanwhile keeps its outputs (it can still be submitted).
        try:
            version = job["metadata"]["resourceVersion"]
            await ctx.kube.delete_agentjob(ctx.episode.namespace, args.job, version)
        except Conflict:
            job = await own_job(ctx, args.job, fresh=True)
            continue
        return CancelResult(
            job=args.job,
            cancelling=True,
            message="cancellation requested; billing stops at the backend's confirmation",
        )
    raise ToolFailure("job_busy", f"{args.job!r} kept changing while it was being cancelled; try again")


async def submit(ctx: ToolContext, args: JobArgs) -> SubmitResult:
    ep = ctx.episode
    if ep.spec.submission is not None:
        raise ToolFailure(
            "already_submitted", f"this episode already submitted {ep.spec.submission.checkpoint_from!r}"
        )
    refuse_if_not_running(ctx)
    job = await own_job(ctx, args.job)
    if job["spec"].get("purpose") != "train" or phase_of(job) != "Succeeded":
        raise ToolFailure(
            "invalid_submission",
            f"{args.job!r} must be a Succeeded train job (it is {phase_of(job)})",
            error_type="invalid_args",
        )
    try:
        # The API server takes a submission only while the Episode is Running (a CRD rule, checked on
        # the object as stored): a submission either lands before the episode's end, and the operator
        # then scores it, or is refused here.
        await ctx.kube.merge_patch_episode(
            ep.namespace, ep.name, {"spec": {"submission": {"checkpointFrom": args.job}}}
        )
    except Refused as exc:
        raise await _submission_refused(ctx) from exc
    return SubmitResult(
        submitted=args.job,
        message=(
            "hidden-split scoring started; the reward arrives with done=true "
            "(jobs_wait without a job waits for it)"
        ),
    )


async def _submission_refused(ctx: ToolContext) -> ToolFailure:
    """Why the API server refused a submission, from the Episode as it is now."""
    body = await ctx.kube.read_episode(ctx.episode.namespace, ctx.episode.name)
    spec, status = (body or {}).get("spec") or {}, (body or {}).get("status") or {}
    if spec.get("submission"):
        return ToolFailure("already_submitted", "the episode's submission is already set")
    ended = status.get("message") or status.get("phase") or "gone"
    return ToolFailure(
        "episode_done",
        f"the episode ended before the submission landed: {ended}",
        details={"outcome": status.get("outcome"), "phase": status.get("phase")},
    )


@dataclass(frozen=True)
class ToolSpec:
    name: str
    description: str
    args: type[Args]
    run: Callable[[ToolContext, Any], Awaitable[BaseModel | dict[str, Any]]]
    read_only: bool = False


TOOLS: dict[str, ToolSpec] = {
    t.name: t
    for t in (
        ToolSpec(
            "task_info",
            "The task: description, inputs, flavors, limits and this episode's budget.",
            NoArgs,
            task_info,
            read_only=True,
        ),
        ToolSpec(
            "jobs_submit",
            "Submit a training job (Python script run under the launcher). Reserves "
            "price x timeout minutes from the budget; a refusal says why, with the numbers.",
            SubmitJobArgs,
            jobs_submit,
        ),
        ToolSpec(
            "jobs_status",
            "Status of one job, or of every job of this episode.",
            JobsStatusArgs,
            jobs_status,
            read_only=True,
        ),
        ToolSpec(
            "jobs_wait",
            "Wait for a job to finish, for any of several jobs to change phase, or (neither given) for "
            "the episode's end after submit; one step however long (up to max_wait_seconds).",
            JobsWaitArgs,
            jobs_wait,
            read_only=True,
        ),
        ToolSpec("jobs_logs", "The last lines of a job's logs.", JobsLogsArgs, jobs_logs, read_only=True),
        ToolSpec(
            "jobs_read_artifact",
            "Read one text file of a job's outputs (<= 256 KiB): its metrics, or its full log "
            "(posttrain-job.log).",
            ReadArtifactArgs,
            jobs_read_artifact,
            read_only=True,
        ),
        ToolSpec("jobs_cancel", "Cancel a job; its cost so far is settled.", JobArgs, jobs_cancel),
        ToolSpec(
            "dev_evaluate",
            "Score a train job's outputs on the public dev split (charged like a job).",
            DevEvaluateArgs,
            dev_evaluate,
        ),
        ToolSpec(
            "submit",
            "Submit a Succeeded train job's outputs as the final answer; scoring on the "
            "hidden split starts and this returns at once.",
            JobArgs,
            submit,
        ),
    )
}
