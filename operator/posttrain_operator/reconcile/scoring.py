"""Scoring a submission: the operator's own `score` job on the hidden split, started once the
submitted checkpoint is a succeeded train job of this episode, and the episode's end from its result."""

from __future__ import annotations

from typing import Any

from graders.tasks import Task
from posttrain_operator.api import conditions as cond
from posttrain_operator.api import provenance
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import API_VERSION, TERMINAL_JOB_PHASES, AgentJobStatus, status_of
from posttrain_operator.api.provenance import script_sha256
from posttrain_operator.api.rules import (
    episode_owner,
    format_time,
    grader_flavor,
    integrity_of,
    new_job_metadata,
    score_job_name,
)
from posttrain_operator.reconcile.cancellation import cancel_all
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.ending import End, end_episode, set_status

UNKNOWN_SCRIPT = "0" * 64


def scoring_outcome(score_job: dict[str, Any] | None) -> End | None:
    """The episode's end once its score job is terminal (None while it is still running)."""
    if score_job is None:
        return None
    status = status_of(AgentJobStatus, score_job.get("status"))
    if status.phase not in TERMINAL_JOB_PHASES:
        return None
    result = status.result
    if (
        status.phase == "Succeeded"
        and result is not None
        and result.status == "ok"
        and result.score is not None
    ):
        integrity = integrity_of(result.findings or [])
        interval = result.interval
        within = f", 95% interval [{interval.low}, {interval.high}]" if interval is not None else ""
        message = f"hidden-split score {result.score} (n={result.n}{within}); integrity {integrity.label}"
        if integrity.label == "violation":
            # The agent's doing, so a real zero; the score it would have had stays in the job's status.
            found = "; ".join(f.summary for f in integrity.findings if f.verdict == "violation")
            message = f"reward withheld: {found} (the grade was {result.score})"
            return End("IntegrityViolation", "0", message, integrity=integrity)
        return End("Scored", result.score, message, reward_interval=interval, integrity=integrity)
    if status.phase == "Succeeded" and result is not None and result.status == "invalid_checkpoint":
        # The policy's own fault: a real zero, not a platform failure.
        return End("Scored", "0", f"invalid checkpoint: {result.reason}")
    detail = (result.reason if result else None) or status.message or status.phase
    return End("GraderFailed", None, f"grading failed on the platform side: {detail}")


async def start_scoring(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, status: EpisodeStatus, task: Task
) -> None:
    assert spec.submission is not None
    meta = body["metadata"]
    source = await ctx.kube.get_agentjob(meta["namespace"], spec.submission.checkpoint_from)
    source_status = status_of(AgentJobStatus, (source or {}).get("status"))
    if (
        source is None
        or source["spec"].get("episode") != meta["name"]
        or source["spec"].get("purpose") != "train"
        or source_status.phase != "Succeeded"
    ):
        await end_episode(
            ctx,
            body,
            End(
                "Scored",
                "0",
                f"submission {spec.submission.checkpoint_from!r} is not a succeeded train job here",
            ),
        )
        return
    await _record_submission(ctx, body, spec, task, source_status.lineage)
    score_job = score_job_name(meta["name"])
    await set_status(
        ctx,
        body,
        phase="Scoring",
        scoring_job=score_job,
        message="scoring the submission on the hidden split",
    )
    ctx.emit(
        body, "Normal", "Scoring", f"submission {spec.submission.checkpoint_from}; grader job {score_job}"
    )
    # The agent is done: its other jobs would only bill.
    await cancel_all(
        ctx, body, cond.EPISODE_ENDED, "the episode's submission is being scored", keep=score_job
    )
    await _ensure_score_job(ctx, body, spec, task, score_job, source_status.lineage)


async def _record_submission(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, task: Task, lineage: list[str]
) -> None:
    """The submission's lineage back to the base model, in the Episode's provenance (once: its name
    is the Episode's)."""
    assert spec.submission is not None
    meta = body["metadata"]
    base = task.base_model
    entry = provenance.SubmissionEntry(
        checkpoint_from=spec.submission.checkpoint_from,
        lineage=lineage,
        base_model=f"{base.repo_id}@{base.revision}" if base is not None else None,
        at=format_time(ctx.clock()),
    )
    record = provenance.ProvenanceSpec(
        format=provenance.FORMAT, episode=meta["name"], writer="operator", submission=entry
    )
    name = provenance.submission_record_name(meta["name"])
    await ctx.kube.append_provenance(meta["namespace"], provenance.record(name, record, episode_owner(body)))


async def _ensure_score_job(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, task: Task, job_name: str, lineage: list[str]
) -> dict[str, Any]:
    """The score job: it grades the submission and screens the outputs and the scripts of the jobs it
    was built on (their scripts' hashes, from one list of the episode's jobs)."""
    meta = body["metadata"]
    assert spec.submission is not None
    listed = await ctx.kube.list_agentjobs(meta["namespace"], meta["name"])
    jobs = {job["metadata"]["name"]: job for job in listed}
    built_on = [spec.submission.checkpoint_from, *lineage]
    # A job whose AgentJob is gone cannot be vouched for: no copy matches an unknown hash.
    evidence = [script_sha256(jobs[job]["spec"].get("script") or "") if job in jobs else UNKNOWN_SCRIPT
                for job in built_on]  # fmt: skip
    wheels = []  # the jobs that installed packages: their staged wheels are screened too
    for name in built_on:
        status = status_of(AgentJobStatus, jobs.get(name, {}).get("status"))
        if status.packages and status.idempotency_key:
            wheels.append({"job": name, "key": status.idempotency_key})
    return await ctx.kube.create_agentjob(
        meta["namespace"],
        {
            "apiVersion": API_VERSION,
            "kind": "AgentJob",
            "metadata": new_job_metadata(job_name, body, controller=True, blocking=True),
            "spec": {
                "episode": meta["name"],
                "purpose": "score",
                "flavor": grader_flavor(spec, task, status_of(EpisodeStatus, body.get("status"))),
                "timeoutSeconds": spec.scoring.timeout_seconds or task.scoring_timeout_seconds,
                "checkpointFrom": spec.submission.checkpoint_from,
                "evidenceFrom": lineage,
                "evidenceScripts": evidence,
                "evidenceWheels": wheels,
            },
        },
    )


async def check_scoring(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, status: EpisodeStatus, task: Task
) -> None:
    meta = body["metadata"]
    job_name = status.scoring_job or score_job_name(meta["name"])
    job = await ctx.kube.get_agentjob(meta["namespace"], job_name)
    if job is None:  # a crash between recording the phase and creating the job
        assert spec.submission is not None
        source = await ctx.kube.get_agentjob(meta["namespace"], spec.submission.checkpoint_from)
        lineage = status_of(AgentJobStatus, (source or {}).get("status")).lineage
        await _ensure_score_job(ctx, body, spec, task, job_name, lineage)
        return
    end = scoring_outcome(job)
    if end is not None:
        await end_episode(ctx, body, end)
