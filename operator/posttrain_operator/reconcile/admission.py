"""Admission: refuse what the episode or its task does not allow, reserve the job's worst case on the
Episode's ledger (one compare-and-swap), then hand the job to submission.

One pass over a new job reads it (its Episode comes from the watch, or is read beside it, as is the
namespace's BudgetQuota), writes the ledger once while the job is adopted under its Episode (unless it
was created so), and writes the job's status twice (admitted with its idempotency key just before the
backend call; then submitted). Every step is idempotent and resumable from the job's status alone: the
ledger entry is keyed by job name, so a pass retried after a crash finds its own reservation and
changes nothing. What is decided without the API is in `admission_rules`.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from graders.tasks import Task
from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import AgentJobSpec, AgentJobStatus, status_of
from posttrain_operator.api.money import micro_to_usd, usd_to_micro
from posttrain_operator.api.rules import (
    InvalidInputs,
    limits_in_force,
    lineage_of,
    parse_time,
)
from posttrain_operator.backends.base import BackendError, UnknownFlavor
from posttrain_operator.jobspec import idempotency_key
from posttrain_operator.k8s import EpisodeUpdate
from posttrain_operator.metrics import spend_labels
from posttrain_operator.reconcile.admission_rules import Rejection, decide_admission, reserve_in
from posttrain_operator.reconcile.context import BackendNotEnabled, Context
from posttrain_operator.reconcile.finishing import release_reservation
from posttrain_operator.reconcile.jobs import Retry, admitting_phases, adopt, with_condition, write_job_status
from posttrain_operator.reconcile.quotas import (
    NamespaceQuota,
    QuotaInvalid,
    not_in_quota,
    quota_in,
    read_quota,
    release_on_quota,
    reserve_on_quota,
)
from posttrain_operator.reconcile.submission import Admission, resume_submission, submit_admitted


@dataclass(frozen=True)
class EpisodeCopy:
    """The Episode an admission pass decides on (None: there is none), and whether it is the watch's
    copy rather than a read: as good as a read for admitting (the ledger's compare-and-swap proves it
    current, or retries from a read), but maybe a little behind, so a refusal is decided on a read."""

    body: dict[str, Any] | None
    watched: bool = False


@dataclass(frozen=True)
class QuotaCopy:
    """The namespace's BudgetQuota read beside a job that looks new (None: it has none), so that
    admission makes no read of its own before the ledger's write: as fresh as a read in turn, and its
    compare-and-swap proves it current or retries from a read."""

    body: dict[str, Any] | None


async def _reject(ctx: Context, job: dict[str, Any], status: AgentJobStatus, rejection: Rejection) -> None:
    status = status.model_copy(
        update={"phase": "Rejected", "reason": rejection.reason, "message": rejection.message}
    )
    status = with_condition(ctx, job, status, cond.ADMITTED, False, rejection.reason, rejection.message)
    status = with_condition(ctx, job, status, cond.FINISHED, True, rejection.reason, rejection.message)
    await write_job_status(ctx, job, status)
    ctx.metrics.rejections.labels(rejection.reason, job["metadata"]["namespace"]).inc()
    ctx.emit(job, "Warning", rejection.reason, rejection.message)


def _may_hold_reservation(name: str, episode: EpisodeCopy) -> bool:
    """Whether the Episode's ledger may hold an unsettled entry for `name`: known from a read, not
    known from the watch's copy, which may be behind the write that made it."""
    if episode.body is None:
        return False
    if episode.watched:
        return True
    entry = status_of(EpisodeStatus, episode.body.get("status")).ledger.entries.get(name)
    return entry is not None and entry.settled_micro_usd is None


async def _refuse(
    ctx: Context,
    job: dict[str, Any],
    status: AgentJobStatus,
    spec: AgentJobSpec,
    episode: EpisodeCopy,
    rejection: Rejection,
) -> None:
    """Reject a job, releasing first what an earlier pass reserved for it: a pass stopped between the
    ledger's write and the job's Admitted write (the operator killed, the API server gone) leaves a
    reservation, and the pass that resumes may refuse the job (its Episode has ended since, an input
    is gone). Released first, so a pass stopped in between releases it again (settling is idempotent)."""
    name = job["metadata"]["name"]
    if _may_hold_reservation(name, episode):
        await release_reservation(ctx, job["metadata"]["namespace"], spec.episode, name)
    await _reject(ctx, job, status, rejection)


async def _waiting(
    ctx: Context, job: dict[str, Any], status: AgentJobStatus, reason: str, message: str
) -> None:
    """A job that cannot be admitted yet for a transient cause says so (once: an unchanged condition
    is neither written nor announced again on the retries)."""
    conditions, changed = ctx.set_condition(job, status.conditions, cond.ADMITTED, False, reason, message)
    if not changed:
        return
    status = status.model_copy(
        update={"phase": "Pending", "reason": reason, "message": message, "conditions": conditions}
    )
    await write_job_status(ctx, job, status)
    ctx.emit(job, "Warning", reason, message)


async def reconcile_agentjob(
    ctx: Context, namespace: str, name: str, *, observed: dict[str, Any] | None = None
) -> None:
    """Admit and submit a new job, or go on with a submission an earlier pass began. `observed` (the
    job as the watch last saw it) is only a hint: a job it shows as new has its Episode and its
    namespace's BudgetQuota read at the same time as itself; every decision is taken on the fresh read."""
    async with ctx.locks("agentjob", namespace, name):
        job, episode, quota = await _read(ctx, namespace, name, observed)
        if job is None or job["metadata"].get("deletionTimestamp"):
            return
        status = status_of(AgentJobStatus, job.get("status"))
        if status.phase in (None, "Pending"):
            admission = await _admit(ctx, job, status, episode, quota)
            if admission is not None:
                await submit_admitted(ctx, job, admission)
        elif status.phase == "Admitted":
            await resume_submission(ctx, job, status)


async def _read(
    ctx: Context, namespace: str, name: str, observed: dict[str, Any] | None
) -> tuple[dict[str, Any] | None, EpisodeCopy | None, QuotaCopy | None]:
    """The job, and when it looks new, what admitting it needs, read at the same time as the job: its
    Episode (as last watched when the operator watches it) and the namespace's BudgetQuota. None for
    what was not looked up (admission reads it then)."""
    hint = observed or {}
    episode_name = (hint.get("spec") or {}).get("episode")
    looks_new = (hint.get("status") or {}).get("phase") in (None, "Pending")
    if not (looks_new and isinstance(episode_name, str)):
        return await ctx.kube.get_agentjob(namespace, name), None, None
    watched = ctx.watched_episodes.get((namespace, episode_name))
    if watched is not None:
        read = ctx.kube.get_agentjob(namespace, name), ctx.kube.get_quota(namespace)
        job, quota = await asyncio.gather(*read)
        return job, EpisodeCopy(dict(watched), watched=True), QuotaCopy(quota)
    job, episode, quota = await asyncio.gather(
        ctx.kube.get_agentjob(namespace, name),
        ctx.kube.get_episode(namespace, episode_name),
        ctx.kube.get_quota(namespace),
    )
    return job, EpisodeCopy(episode), QuotaCopy(quota)


async def _price(
    ctx: Context, job: dict[str, Any], status: AgentJobStatus, backend: str, flavor: str
) -> int | Rejection:
    """The flavor's price per minute on the episode's backend, or why the job is refused. A backend
    that does not answer is waited for: the job says so, and the pass is retried."""
    try:
        return await ctx.backend(backend).price(flavor)
    except BackendNotEnabled as exc:
        return Rejection(exc.reason, str(exc))
    except UnknownFlavor as exc:
        return Rejection(cond.INVALID_JOB, str(exc))
    except BackendError as exc:
        if not exc.transient:  # a refused token or request: retrying would only repeat it
            ctx.note_failure(backend, exc.reason, str(exc))
            return Rejection(exc.reason, f"{backend}: {exc}")
        await _waiting(ctx, job, status, exc.reason, f"{backend} did not answer; retrying: {exc}")
        raise Retry(f"price lookup failed: {exc}") from exc


async def _lineage(ctx: Context, job: dict[str, Any], spec: AgentJobSpec) -> list[str] | Rejection:
    """The jobs a train job reads outputs of, checked as they are now (read only when it names any)."""
    if not spec.inputs_from:
        return []
    namespace = job["metadata"]["namespace"]
    found = await asyncio.gather(*(ctx.kube.get_agentjob(namespace, name) for name in spec.inputs_from))
    try:
        return lineage_of(job["metadata"]["name"], spec, dict(zip(spec.inputs_from, found, strict=True)))
    except InvalidInputs as exc:
        return Rejection(cond.INVALID_JOB, str(exc))


async def _decide(
    ctx: Context, job: dict[str, Any], spec: AgentJobSpec, episode: EpisodeCopy | None
) -> tuple[EpisodeCopy, tuple[Task, EpisodeSpec, list[str]] | Rejection]:
    """The job's Episode (read unless the pass has it) and `decide_admission` on it; a refusal of a
    watched copy is decided again on a read."""
    namespace = job["metadata"]["namespace"]
    if episode is None or episode.body is None or episode.body["metadata"]["name"] != spec.episode:
        episode = EpisodeCopy(await ctx.kube.get_episode(namespace, spec.episode))
    decided = decide_admission(job, spec, episode.body)
    if isinstance(decided, Rejection) and episode.watched:
        episode = EpisodeCopy(await ctx.kube.get_episode(namespace, spec.episode))
        decided = decide_admission(job, spec, episode.body)
    return episode, decided


async def _quota(
    ctx: Context,
    namespace: str,
    ep_spec: EpisodeSpec,
    spec: AgentJobSpec,
    read: QuotaCopy | None,
    *,
    platform: bool,
) -> NamespaceQuota | Rejection | None:
    """The namespace's BudgetQuota (as `read` beside the job, else read now), None when it has none,
    or why it refuses the job outright (a grader job is the platform's: only the dollar figures
    record it)."""
    try:
        held = quota_in(read.body) if read is not None else await read_quota(ctx, namespace)
    except QuotaInvalid as exc:
        return Rejection(cond.QUOTA_INVALID, str(exc))
    if held is None or platform:
        return held
    why = not_in_quota(held.terms, ep_spec.backend, usd_to_micro(ep_spec.budget_usd), spec.flavor)
    return Rejection(cond.NOT_IN_QUOTA, why) if why else held


def _count_admission(
    ctx: Context, job: dict[str, Any], spec: AgentJobSpec, episode: dict[str, Any], reserved: int
) -> None:
    ctx.metrics.reserved.labels(*spend_labels(episode)).inc(reserved)
    created = parse_time(job["metadata"].get("creationTimestamp"))
    if created is not None:
        waited = (ctx.clock() - created).total_seconds()
        ctx.metrics.admission_seconds.labels(spec.purpose).observe(max(0.0, waited))


async def _reserve_within_quota(
    ctx: Context,
    job: dict[str, Any],
    spec: AgentJobSpec,
    held: NamespaceQuota | None,
    amount: int,
    reserve: Callable[[], Awaitable[EpisodeUpdate[Rejection | None]]],
    *,
    platform: bool,
) -> tuple[Rejection | None, bool]:
    """The Episode's reservation (`reserve`), on the namespace's BudgetQuota first where it has one:
    the refusal of either (None: reserved), and whether this pass wrote the Episode's."""
    if held is None:
        update = await reserve()
        return update.result, update.written
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    # The namespace's admissions take turns: a quota reservation its Episode then refuses is released
    # before any other admission sees it, so none is refused for headroom it only seemed to lack.
    async with ctx.locks("quota", namespace):
        refusal = await reserve_on_quota(ctx, namespace, held, name, spec.episode, amount, platform=platform)
        if refusal:
            return Rejection(cond.QUOTA_EXCEEDED, refusal), False
        update = await reserve()
        if update.result is not None:  # released before the job is Rejected: a pass stopped
            await release_on_quota(ctx, namespace, name)  # in between does it again
    return update.result, update.written


async def _reserve(
    ctx: Context,
    job: dict[str, Any],
    spec: AgentJobSpec,
    episode: EpisodeCopy,
    amount: int,
    max_concurrent: int,
    dev_limit: int | None,
) -> EpisodeUpdate[Rejection | None]:
    """The ledger's compare-and-swap from the Episode this pass has, the job adopted meanwhile."""
    assert episode.body is not None
    namespace, name = job["metadata"]["namespace"], job["metadata"]["name"]
    platform, phases = spec.purpose == "score", admitting_phases(spec.purpose)

    def reserve(_: dict[str, Any], current: EpisodeStatus) -> tuple[EpisodeStatus | None, Rejection | None]:
        return reserve_in(
            current,
            name,
            amount,
            platform=platform,
            max_concurrent=max_concurrent,
            allowed_phases=phases,
            dev_evaluation=spec.purpose == "devEval",
            dev_limit=dev_limit,
        )

    # The adoption writes the job, so it goes beside the ledger's write rather than the job's status
    # write: two writes to one object at once make the API server retry one of them.
    update, _ = await asyncio.gather(
        ctx.kube.update_episode_status(namespace, spec.episode, reserve, seen=episode.body),
        adopt(ctx, job, episode.body),
    )
    if update.result is not None and episode.watched:  # refused without a write: maybe a stale copy
        update = await ctx.kube.update_episode_status(namespace, spec.episode, reserve)
    return update


def _admitted(
    ctx: Context,
    job: dict[str, Any],
    status: AgentJobStatus,
    spec: AgentJobSpec,
    backend: str,
    lineage: list[str],
    reserved: int,
    message: str,
) -> AgentJobStatus:
    """The job's status once admitted: its idempotency key (written before the backend call), its
    reservation, lineage and network."""
    status = status.model_copy(
        update={
            "phase": "Admitted",
            "reason": None,
            "message": message,
            "backend": backend,
            "idempotency_key": idempotency_key(job["metadata"]["uid"]),
            "reserved_micro_usd": reserved,
            "reserved_usd": micro_to_usd(reserved),
            "lineage": lineage,
            "network": ctx.job_network(backend).mode if spec.purpose == "train" else "unix",
        }
    )
    return with_condition(ctx, job, status, cond.ADMITTED, True, "Reserved", message)


async def _admit(
    ctx: Context,
    job: dict[str, Any],
    status: AgentJobStatus,
    episode: EpisodeCopy | None,
    quota: QuotaCopy | None,
) -> Admission | None:
    """Reserve on the ledger; None when the job is refused (and marked Rejected). A watched copy of
    the Episode is as good as a read for admitting (the ledger's compare-and-swap proves it current, or
    retries from a read), but a refusal is decided on a read only: the copy may be a little behind."""
    meta = job["metadata"]
    try:
        spec = AgentJobSpec.model_validate(job["spec"])
    except ValidationError as exc:
        await _reject(ctx, job, status, Rejection(cond.INVALID_JOB, f"invalid spec: {exc}"))
        return None
    episode, decided = await _decide(ctx, job, spec, episode)
    if isinstance(decided, Rejection):
        await _refuse(ctx, job, status, spec, episode, decided)
        return None
    task, ep_spec, _ = decided
    assert episode.body is not None
    lineage = await _lineage(ctx, job, spec)
    if isinstance(lineage, Rejection):
        await _refuse(ctx, job, status, spec, episode, lineage)
        return None
    platform = spec.purpose == "score"
    held = await _quota(ctx, meta["namespace"], ep_spec, spec, quota, platform=platform)
    if isinstance(held, Rejection):
        await _refuse(ctx, job, status, spec, episode, held)
        return None
    price = await _price(ctx, job, status, ep_spec.backend, spec.flavor)
    if isinstance(price, Rejection):
        await _refuse(ctx, job, status, spec, episode, price)
        return None
    amount = ledger_math.reservation_for(price, spec.timeout_seconds)
    max_concurrent = limits_in_force(ep_spec, task).max_concurrent_jobs
    dev_limit = task.integrity.dev_evaluations.max_calls
    reserve = functools.partial(_reserve, ctx, job, spec, episode, amount, max_concurrent, dev_limit)
    refused, written = await _reserve_within_quota(ctx, job, spec, held, amount, reserve, platform=platform)
    if refused is not None:  # decided on the ledger as it is (or on the quota, before it): no entry
        await _reject(ctx, job, status, refused)
        return None
    reserved = 0 if platform else amount
    if written:  # not a pass resumed after a crash, which found its reservation made
        _count_admission(ctx, job, spec, episode.body, reserved)
    message = f"reserved ${micro_to_usd(reserved)} at ${micro_to_usd(price)}/min for {spec.timeout_seconds}s"
    status = _admitted(ctx, job, status, spec, ep_spec.backend, lineage, reserved, message)
    return Admission(spec, task, status, message)
