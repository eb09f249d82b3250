"""Episode lifecycle: start (or wait while the namespace has orphans), enforce limits, hand a
submission to scoring, end, and retry unconfirmed cancellations with backoff. How an episode ends is
`ending`; how a submission is scored is `scoring`."""

from __future__ import annotations

import base64
import logging
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from graders.tasks import Task, UnknownTaskError, get_task
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import status_of
from posttrain_operator.api.money import usd_to_micro
from posttrain_operator.api.rules import (
    ENDED_PHASES,
    EPISODE_LABEL,
    allowed_flavors,
    episode_owner,
    format_time,
    grader_flavor,
    jobs_running,
    limits_in_force,
    parse_time,
    remaining_micro_usd,
    token_hash,
)
from posttrain_operator.backends.base import BackendError, SupportsEpisodeCleanup
from posttrain_operator.ledger import unsettled, with_totals
from posttrain_operator.reconcile.context import BackendNotEnabled, Context
from posttrain_operator.reconcile.ending import (
    End,
    end_episode,
    fail_episode,
    release_backend_resources,
    seal_provenance,
    set_status,
    settle_ended,
)
from posttrain_operator.reconcile.orphan_records import orphans_blocking
from posttrain_operator.reconcile.orphans import collect_orphans
from posttrain_operator.reconcile.quotas import QuotaInvalid, read_quota
from posttrain_operator.reconcile.scoring import check_scoring, start_scoring

log = logging.getLogger(__name__)

TOKEN_SECRET_KEY = "token"
# How long an idle Episode that has not changed goes without a pass: its decision depends on the
# clock only through its deadline, except for a backend's price (cached, looked up again on expiry)
# when none of its jobs runs; one pass a minute keeps that in view.
IDLE_RECHECK = timedelta(seconds=60)


# --- pure decisions ----------------------------------------------------------------------------


def limit_reached(
    spec: EpisodeSpec, status: EpisodeStatus, task: Task, now: datetime, cheapest_price: int | None
) -> End | None:
    """The step, wall-time and budget limits: each ends the episode with reward "0"."""
    max_steps = limits_in_force(spec, task).max_steps
    if status.steps >= max_steps:
        return End(
            "LimitReached", "0", f"step limit reached ({status.steps} of {max_steps}) without a submission"
        )
    deadline = parse_time(status.deadline)
    if deadline is not None and now >= deadline:
        return End("LimitReached", "0", "wall-time limit reached without a submission")
    remaining = remaining_micro_usd(spec, status.ledger)
    if cheapest_price is not None and not jobs_running(status.ledger) and remaining < cheapest_price:
        return End("LimitReached", "0", "budget exhausted: no job can be admitted any more")
    return None


# --- actions -----------------------------------------------------------------------------------


@dataclass
class Quiet:
    """An Episode a pass found idle: as long as it is unchanged (the same resourceVersion), it stays
    idle until `until`, so the ticks in between need no pass at all (2,000 Episodes ticking every
    2 s would otherwise parse and decide 1,000 times a second to find nothing to do)."""

    version: str | None = None
    until: datetime | None = None

    def holds(self, version: str | None, now: datetime) -> bool:
        return self.until is not None and version == self.version and now < self.until


async def reconcile_episode(
    ctx: Context, namespace: str, name: str, observed: dict[str, Any] | None = None
) -> datetime | None:
    """One pass over an Episode. `observed` (the watch's latest copy) saves a read on the idle ticks;
    every write still goes through a compare-and-swap on a fresh read. Returns, when `observed` was
    idle, until when it stays so if unchanged."""
    async with ctx.locks("episode", namespace, name):
        if observed is not None:
            quiet_until = await _idle(ctx, observed)
            if quiet_until is not None:
                return quiet_until
        body = await ctx.kube.get_episode(namespace, name)
        if body is None or body["metadata"].get("deletionTimestamp"):
            return None
        spec = EpisodeSpec.model_validate(body["spec"])
        status = status_of(EpisodeStatus, body.get("status"))
        try:
            task = get_task(spec.task)
        except UnknownTaskError as exc:
            if status.phase not in ENDED_PHASES:
                await fail_episode(ctx, body, status, cond.UNKNOWN_TASK, str(exc))
            return None
        if status.phase in (None, "Pending") and spec.backend not in ctx.backends:
            # Nothing could ever run: say so at once rather than start a clock no job can use.
            try:
                ctx.backend(spec.backend)
            except BackendNotEnabled as exc:
                await fail_episode(ctx, body, status, exc.reason, str(exc))
            return None
        if status.phase in (None, "Pending"):
            unrunnable = _unrunnable(ctx, spec, task)
            if unrunnable is not None:
                await fail_episode(ctx, body, status, *unrunnable)
                return None
        await _advance(ctx, body, spec, status, task)
        if status.orphaned_jobs:
            await collect_orphans(ctx, namespace, name)
        return None


def _unrunnable(ctx: Context, spec: EpisodeSpec, task: Task) -> tuple[str, str] | None:
    """Why a Pending Episode's task can never run on this operator (a condition reason and its message),
    checked before its clock starts; None: it can."""
    if task.requires_loopback:
        network = ctx.job_network(spec.backend)
        if network.mode != "loopback":
            why = f"{spec.backend}: {network.reason}"
            return cond.NETWORK_UNAVAILABLE, f"task {task.name}'s jobs need loopback networking; {why}"
    if task.requires_sandbox:
        used = dict.fromkeys([*allowed_flavors(spec, task), grader_flavor(spec, task)])  # graders too
        bare = [f for f in used if f not in ctx.sandboxed_flavors(spec.backend)]
        if bare:
            return cond.SANDBOX_UNAVAILABLE, (
                f"task {task.name}'s jobs must run under a sandboxing runtime; on {spec.backend}, "
                f"flavor(s) {', '.join(bare)} do not (pods.sandboxRuntimeClasses: "
                f"{', '.join(ctx.settings.pods_sandbox_runtime_classes) or 'none'})"
            )
    missing = sorted(task.environments() - set(ctx.settings.environment_images))
    if missing:
        return cond.ENVIRONMENT_UNAVAILABLE, (
            f"task {task.name}'s jobs run in the environment image(s) {', '.join(missing)}, which this "
            "operator has no image for (the chart's `environments`)"
        )
    return None


async def _advance(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, status: EpisodeStatus, task: Task
) -> None:
    """The step the Episode's phase calls for, at most one per pass."""
    if status.phase in (None, "Pending"):
        await _start(ctx, body, spec, status, task)
    elif status.phase == "Running":
        if spec.submission is not None:
            await start_scoring(ctx, body, spec, status, task)
        else:
            end = await _limit(ctx, spec, status, task)
            if end is not None:
                await end_episode(ctx, body, end)
    elif status.phase == "Scoring":
        await check_scoring(ctx, body, spec, status, task)
    elif status.phase in ENDED_PHASES and _has_unsettled_jobs(status):
        # Cancels the jobs left, and settles the entries of jobs deleted unsettled, which would
        # otherwise hold the Episode here (never released) for good.
        await settle_ended(ctx, body)
    elif (
        status.phase in ENDED_PHASES
        and not status.orphaned_jobs  # their final statuses are unread (a pod's, held by the namespace)
        and _needs_release(ctx, spec.backend, status)
        and await release_backend_resources(ctx, body)
    ):
        # Every job is settled (confirmed gone); a restarted operator lands here too.
        await set_status(ctx, body, backend_released=True)
    elif status.phase in ENDED_PHASES and status.provenance is None:
        await seal_provenance(ctx, body)


async def _idle(ctx: Context, observed: dict[str, Any]) -> datetime | None:
    """Until when there is nothing to do for this Episode as last seen (None: there is work now): a
    running one within its limits and without a submission (until its deadline, at the latest), or an
    ended one with nothing left to cancel. Anything else is decided on a fresh read."""
    status = status_of(EpisodeStatus, observed.get("status"))
    if status.orphaned_jobs or observed["metadata"].get("deletionTimestamp"):
        return None
    recheck = ctx.clock() + IDLE_RECHECK
    if status.phase in ENDED_PHASES:
        idle = (
            not _has_unsettled_jobs(status)
            and not _needs_release(ctx, observed["spec"]["backend"], status)
            and status.provenance is not None
        )
        return recheck if idle else None
    if status.phase != "Running":
        return None
    spec = EpisodeSpec.model_validate(observed["spec"])
    try:
        task = get_task(spec.task)
    except UnknownTaskError:
        return None
    if spec.submission is not None or await _limit(ctx, spec, status, task) is not None:
        return None
    deadline = parse_time(status.deadline)
    return min(recheck, deadline) if deadline is not None else recheck


async def _limit(ctx: Context, spec: EpisodeSpec, status: EpisodeStatus, task: Task) -> End | None:
    """The limits in force; the step and wall-time limits first, so a backend that does not answer
    a price lookup never delays them. The budget limit needs a price only when no job runs."""
    end = limit_reached(spec, status, task, ctx.clock(), None)
    if end is not None or jobs_running(status.ledger):
        return end
    return limit_reached(spec, status, task, ctx.clock(), await _cheapest_price(ctx, spec, task, status))


def _needs_release(ctx: Context, backend: str, status: EpisodeStatus) -> bool:
    return isinstance(ctx.backends.get(backend), SupportsEpisodeCleanup) and not status.backend_released


def _has_unsettled_jobs(status: EpisodeStatus) -> bool:
    orphaned = {o.name for o in status.orphaned_jobs}
    return bool(unsettled(status.ledger) - orphaned)


async def _cheapest_price(ctx: Context, spec: EpisodeSpec, task: Task, status: EpisodeStatus) -> int | None:
    """None when no price is known (the backend is off or not answering): the budget limit then
    waits, the step and wall-time limits do not."""
    backend = ctx.backends.get(spec.backend)
    if backend is None:
        return None
    prices = []
    for flavor in allowed_flavors(spec, task, status):
        try:
            prices.append(await backend.price(flavor))
        except BackendError as exc:
            if exc.transient:  # the backend is not answering: the other flavors would wait on it too
                return None
            continue
    return min(prices) if prices else None


async def _flavors_in_quota(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, status: EpisodeStatus, task: Task
) -> list[str] | None:
    """The Episode's flavors narrowed to its namespace's BudgetQuota, in its order; None where no quota
    lists flavors (the Episode's or its task's then hold). An empty list: the Episode has failed, as no
    flavor it may use is allowed, or the quota cannot be applied."""
    try:
        held = await read_quota(ctx, body["metadata"]["namespace"])
    except QuotaInvalid as exc:
        await fail_episode(ctx, body, status, cond.QUOTA_INVALID, str(exc))
        return []
    if held is None or held.terms.flavors is None:
        return None
    wanted = allowed_flavors(spec, task)
    flavors = [f for f in wanted if held.terms.allows_flavor(f)]
    if not flavors:
        message = (
            f"none of the flavors {', '.join(wanted)} is among those the namespace's BudgetQuota allows: "
            f"{', '.join(sorted(held.terms.flavors))}"
        )
        await fail_episode(ctx, body, status, cond.NOT_IN_QUOTA, message)
    return flavors


async def _start(
    ctx: Context, body: dict[str, Any], spec: EpisodeSpec, status: EpisodeStatus, task: Task
) -> None:
    """Running, once its flavors are within the namespace's quota ([]: it failed) and no job of the
    namespace is left with its cancellation unconfirmed."""
    flavors = await _flavors_in_quota(ctx, body, spec, status, task)
    if flavors == []:
        return
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    # From the watch, not a list: with each start listing every Episode, a burst of Episodes cost work
    # quadratic in their number. An orphan recorded in the same instant as this start is ordered
    # after it, as if the start had come first.
    blocking = orphans_blocking(ctx.namespace_orphans, namespace, name)
    if blocking:
        message = f"jobs whose cancellation is unconfirmed in this namespace: {', '.join(blocking)}"
        conditions, changed = ctx.set_condition(
            body, status.conditions, cond.BLOCKED, True, cond.ORPHANED_JOBS, message
        )
        if status.phase != "Pending" or changed:
            await set_status(ctx, body, phase="Pending", conditions=conditions)
            ctx.emit(body, "Warning", cond.ORPHANED_JOBS, message)
        return
    token_hash_, secret_name = await _agent_token(ctx, body, spec)
    now = ctx.clock()
    wall = limits_in_force(spec, task).max_wall_seconds
    ledger = with_totals(status.ledger.model_copy(update={"budget_micro_usd": usd_to_micro(spec.budget_usd)}))
    conditions = status.conditions
    if any(c.type == cond.BLOCKED for c in conditions):
        conditions, _ = ctx.set_condition(
            body, conditions, cond.BLOCKED, False, "NoOrphans", "no orphaned jobs"
        )
    conditions, _ = ctx.set_condition(
        body, conditions, cond.READY, True, "Started", f"started task {task.name}"
    )
    health = ctx.health.get(spec.backend)
    if health is not None:
        conditions, _ = ctx.set_condition(
            body, conditions, cond.BACKEND_READY, health.ok, health.reason or "CredentialsAccepted",
            f"{spec.backend}: {health.message}",
        )  # fmt: skip
    await set_status(
        ctx,
        body,
        phase="Running",
        started_at=format_time(now),
        deadline=format_time(now + timedelta(seconds=wall)),
        ledger=ledger,
        network=ctx.job_network(spec.backend),
        agent_token_hash=token_hash_,
        agent_token_secret=secret_name,
        flavors=flavors,
        conditions=conditions,
        observed_generation=body["metadata"].get("generation"),
    )
    ctx.emit(body, "Normal", "Started", f"budget ${spec.budget_usd}, {wall}s wall time")
    if health is not None and not health.ok:
        assert health.reason is not None
        message = f"{spec.backend}: {health.message}; its jobs will be rejected"
        ctx.emit(body, "Warning", health.reason, message)


async def _agent_token(ctx: Context, body: dict[str, Any], spec: EpisodeSpec) -> tuple[str, str | None]:
    """The creator's token hash, or a fresh token in a Secret the Episode owns (only its hash is kept)."""
    if spec.agent_token_hash:
        return spec.agent_token_hash, None
    meta = body["metadata"]
    secret_name = f"{meta['name']}-agent-token"
    token = secrets.token_urlsafe(32)
    created = await ctx.kube.ensure_secret(
        meta["namespace"],
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": secret_name,
                "labels": {EPISODE_LABEL: meta["name"]},
                "ownerReferences": [episode_owner(body)],
            },
            "type": "Opaque",
            "data": {TOKEN_SECRET_KEY: base64.b64encode(token.encode()).decode()},
        },
    )
    if not created:  # a retry after a crash: the Secret from the first attempt is the truth
        existing = await ctx.kube.read_secret_data(meta["namespace"], secret_name)
        token = base64.b64decode(existing[TOKEN_SECRET_KEY]).decode()
    return token_hash(token), secret_name
