"""The namespace's BudgetQuota beside each Episode's ledger: admission reserves on both, settlement
releases both, and a periodic pass keeps the quota's figures current and settles what no job pass
will (docs/quotas.md).

Two objects cannot change in one write, so the order makes every crash resumable. Admission reserves
on the quota first, then on the Episode; a job the Episode refuses has its quota reservation released
before it is marked Rejected. Settlement writes the Episode first, then the quota. Either way a pass
that stops half way leaves a quota reservation that the next pass of the job finds (both writes are
keyed by job name), or that the periodic pass resolves from the Episode's ledger, which is the
record of what a job cost.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from posttrain_operator import quota
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.api.models import TERMINAL_JOB_PHASES, AgentJobStatus, status_of
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.quota import BudgetQuotaSpec, BudgetQuotaStatus
from posttrain_operator.backends.base import BackendError, UnknownFlavor
from posttrain_operator.metrics import QuotaSeen
from posttrain_operator.reconcile.context import Context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class NamespaceQuota:
    """A namespace's BudgetQuota as this pass read it, with its terms parsed."""

    body: dict[str, Any]
    terms: quota.QuotaTerms


class QuotaInvalid(ValueError):
    """The namespace's BudgetQuota cannot be applied; its jobs are refused until it is fixed."""


def terms_in(body: dict[str, Any]) -> quota.QuotaTerms:
    """The terms of a BudgetQuota as read; QuotaInvalid when they cannot be applied."""
    try:
        return quota.terms_of(BudgetQuotaSpec.model_validate(body.get("spec") or {}))
    except ValueError as exc:
        raise QuotaInvalid(f"the namespace's BudgetQuota cannot be applied: {exc}") from exc


async def read_quota(ctx: Context, namespace: str) -> NamespaceQuota | None:
    """The namespace's quota, or None when it has none. QuotaInvalid for one the operator cannot apply:
    a budget control that is not understood admits nothing."""
    return quota_in(await ctx.kube.get_quota(namespace))


def quota_in(body: dict[str, Any] | None) -> NamespaceQuota | None:
    """A BudgetQuota as read (None: the namespace has none); QuotaInvalid as `read_quota`."""
    return None if body is None else NamespaceQuota(body, terms_in(body))


def not_in_quota(terms: quota.QuotaTerms, backend: str, budget_micro_usd: int, flavor: str) -> str:
    """Why the quota does not allow a job of this Episode, or an empty string when it does."""
    if terms.backends is not None and backend not in terms.backends:
        allowed = ", ".join(sorted(terms.backends))
        return f"the namespace's BudgetQuota allows the backends {allowed}, not {backend}"
    cap = terms.max_episode_budget_micro_usd
    if cap is not None and budget_micro_usd > cap:
        return (
            f"the Episode's budget ${micro_to_usd(budget_micro_usd)} is above the ${micro_to_usd(cap)} the "
            "namespace's BudgetQuota allows one Episode"
        )
    if not terms.allows_flavor(flavor):
        allowed = ", ".join(sorted(terms.flavors or ()))
        return f"flavor {flavor!r} is not among the flavors the namespace's BudgetQuota allows: {allowed}"
    return ""


async def reserve_on_quota(
    ctx: Context, namespace: str, held: NamespaceQuota, job: str, episode: str, amount: int, *, platform: bool
) -> str:
    """Reserve the job's worst case on the quota (one compare-and-swap); the refusal, or empty when it
    fits (or was reserved by an earlier pass)."""

    def reserve(body: dict[str, Any], current: BudgetQuotaStatus) -> tuple[BudgetQuotaStatus | None, str]:
        try:
            terms = terms_in(body)  # as written now: the platform may have changed it since the read
        except QuotaInvalid as exc:
            return None, str(exc)
        decided = quota.reserve(current, terms, job, episode, amount, ctx.clock(), platform=platform)
        return decided.status, decided.refusal

    update = await ctx.kube.update_quota_status(namespace, reserve, seen=held.body)
    return update.result


async def _change_quota(
    ctx: Context,
    namespace: str,
    change: Callable[[BudgetQuotaStatus, quota.QuotaTerms], BudgetQuotaStatus | None],
) -> bool:
    def mutate(body: dict[str, Any], current: BudgetQuotaStatus) -> tuple[BudgetQuotaStatus | None, None]:
        try:
            return change(current, terms_in(body)), None
        except QuotaInvalid:
            return None, None  # left as it is until the platform fixes it

    try:
        return (await ctx.kube.update_quota_status(namespace, mutate)).written
    except LookupError:
        return False


async def release_on_quota(ctx: Context, namespace: str, job: str) -> None:
    """Drop a job's quota reservation without a charge (its Episode refused it)."""
    await _change_quota(ctx, namespace, lambda s, t: quota.release(s, t, job, ctx.clock()))


async def settle_on_quota(ctx: Context, namespace: str, job: str, billed: int) -> None:
    """Book what the backend billed for `job` on the quota and drop its reservation."""
    await _change_quota(ctx, namespace, lambda s, t: quota.settle(s, t, job, billed, ctx.clock()))


def billed_on_ledger(status: EpisodeStatus, job: str) -> int | None:
    """What the Episode's ledger settled `job` at, the agent's charge and any overrun together (what
    the backend billed); None while it is unsettled or has no entry."""
    entry = status.ledger.entries.get(job)
    if entry is None or entry.settled_micro_usd is None:
        return None
    overrun = status.ledger.entries.get(f"{job}.overrun")
    return entry.settled_micro_usd + (overrun.settled_micro_usd or 0 if overrun else 0)


@dataclass(frozen=True)
class Resolution:
    """What the periodic pass does with one reservation: settle it at `billed`, or release it."""

    job: str
    billed: int | None  # None: release without a charge
    why: str


async def _resolve(
    ctx: Context, namespace: str, job: str, entry_episode: str, held: int, parsed: dict[str, EpisodeStatus]
) -> Resolution | None:
    """Whether a reservation no job pass will settle can be resolved now, and how. The Episode's ledger
    decides: settled there, settled here at the same bill; gone, at the reservation (the worst case,
    as for a job deleted unsettled); no entry there, released once the job can no longer be admitted."""
    watched = ctx.watched_episodes.get((namespace, entry_episode))
    if watched is not None:  # an entry, once on the ledger, stays: the watch's copy can say so
        if entry_episode not in parsed:  # once per Episode and pass: it may hold many reservations
            parsed[entry_episode] = status_of(EpisodeStatus, watched.get("status"))
        decided, resolution = _on_ledger(parsed[entry_episode], job)
        if decided:
            return resolution
    # Anything else is decided on a fresh read: a copy older than the admission has no entry yet.
    episode = await ctx.kube.get_episode(namespace, entry_episode)
    if episode is None:
        return Resolution(job, held, f"its Episode {entry_episode} is gone; settled at the reservation")
    decided, resolution = _on_ledger(status_of(EpisodeStatus, episode.get("status")), job)
    if decided:
        return resolution
    found = await ctx.kube.get_agentjob(namespace, job)
    phase = status_of(AgentJobStatus, (found or {}).get("status")).phase
    if found is None or phase in TERMINAL_JOB_PHASES:
        return Resolution(job, None, "never admitted by its Episode; released")
    return None  # still being admitted


def _on_ledger(status: EpisodeStatus, job: str) -> tuple[bool, Resolution | None]:
    """Whether the job's entry on its Episode's ledger decides, and how: settled there, at the same
    bill; still running (None), its own pass settles it. No entry: not decided."""
    billed = billed_on_ledger(status, job)
    if billed is not None:
        return True, Resolution(job, billed, "settled on its Episode's ledger")
    return job in status.ledger.entries, None


async def reconcile_quota(ctx: Context, namespace: str) -> None:
    """The quota's figures for the window in force and its conditions, and the reservations that no job
    pass will settle resolved. Runs periodically: a month rolls over with no job to notice."""
    body = await ctx.kube.get_quota(namespace)
    if body is None:
        ctx.metrics.view.observe_quota(namespace, None)
        return
    current = status_of(BudgetQuotaStatus, body.get("status"))
    resolutions: list[Resolution] = []
    parsed: dict[str, EpisodeStatus] = {}
    for job, entry in sorted(current.reservations.items()):
        # Under the job's lock: an admission pass of this job in this process is not half way.
        async with ctx.locks("agentjob", namespace, job):
            found = await _resolve(ctx, namespace, job, entry.episode, entry.micro_usd, parsed)
        if found is not None:
            resolutions.append(found)
    await _refresh(ctx, namespace, resolutions, await _unoffered_flavors(ctx, body))
    for found in resolutions:
        log.info("quota %s: %s: %s", namespace, found.job, found.why)


async def _unoffered_flavors(ctx: Context, body: dict[str, Any]) -> list[str] | None:
    """The quota's flavors that no backend it allows offers (a typo admits nothing of that flavor, so
    the platform is told); None when it cannot be told now (a backend not answering) or need not be."""
    try:
        terms = terms_in(body)
    except QuotaInvalid:
        return None
    if terms.flavors is None:
        return None
    backends = [b for name, b in ctx.backends.items() if terms.backends is None or name in terms.backends]
    unoffered = []
    for flavor in sorted(terms.flavors):
        offered = False
        for backend in backends:
            try:
                await backend.price(flavor)
            except UnknownFlavor:
                continue
            except BackendError:
                return None
            offered = True
            break
        if not offered:
            unoffered.append(flavor)
    return unoffered


async def _refresh(
    ctx: Context, namespace: str, resolutions: list[Resolution], unoffered: list[str] | None
) -> None:
    now = ctx.clock()

    def mutate(body: dict[str, Any], current: BudgetQuotaStatus) -> tuple[BudgetQuotaStatus | None, None]:
        try:
            terms = terms_in(body)
        except QuotaInvalid as exc:
            conditions, _ = ctx.set_condition(
                body, current.conditions, cond.READY, False, cond.QUOTA_INVALID, str(exc)
            )
            new = current.model_copy(update={"conditions": conditions})
            return (None if new == current else new), None
        new = current
        for found in resolutions:
            if found.billed is None:
                new = quota.release(new, terms, found.job, now) or new
            else:
                new = quota.settle(new, terms, found.job, found.billed, now) or new
        new = quota.with_totals(new, terms, now)
        applied = f"{micro_to_usd(terms.limit_micro_usd)} USD for {new.window}"
        conditions, _ = ctx.set_condition(body, new.conditions, cond.READY, True, "Applied", applied)
        over = quota.over_limit(new)
        spent, reserved = micro_to_usd(new.settled_micro_usd), micro_to_usd(new.reserved_micro_usd)
        why = (
            f"${spent} spent and ${reserved} reserved in {new.window}, above the "
            f"${micro_to_usd(new.limit_micro_usd)} limit: no job is admitted"
            if over
            else "within the limit"
        )
        conditions, _ = ctx.set_condition(
            body, conditions, cond.OVER_LIMIT, over, "LimitLowered" if over else "WithinLimit", why
        )
        if unoffered is not None:
            offered = (
                f"no backend this quota allows offers {', '.join(unoffered)}: no job can use them"
                if unoffered
                else "every flavor listed is offered"
            )
            conditions, _ = ctx.set_condition(
                body, conditions, cond.FLAVORS_OFFERED, not unoffered,
                cond.UNKNOWN_FLAVOR if unoffered else "Offered", offered,
            )  # fmt: skip
        generation = body["metadata"].get("generation")
        new = new.model_copy(update={"conditions": conditions, "observed_generation": generation})
        return (None if new == current else new), None

    try:
        update = await ctx.kube.update_quota_status(namespace, mutate)
    except LookupError:
        ctx.metrics.view.observe_quota(namespace, None)
        return
    now_in = update.status
    seen = QuotaSeen(now_in.limit_micro_usd, now_in.reserved_micro_usd, now_in.settled_micro_usd,
                     now_in.platform_micro_usd)  # fmt: skip
    ctx.metrics.view.observe_quota(namespace, seen)


async def keep_quotas(ctx: Context) -> None:
    """Every BudgetQuota kept current, one list per round: a loop of the operator's own rather than a
    kopf daemon, which would put a finalizer on each quota (deleting one would wait on the operator)."""
    while True:
        try:
            namespaces = ctx.settings.watch_namespaces or await ctx.kube.namespaces_with_quotas()
            for gone in set(ctx.metrics.view.quotas) - set(namespaces):
                ctx.metrics.view.observe_quota(gone, None)
            for namespace in namespaces:
                await reconcile_quota(ctx, namespace)
        except Exception as exc:
            ctx.metrics.reconcile_errors.labels("BudgetQuota", type(exc).__name__).inc()
            log.warning("keeping the quotas current failed: %s", exc)
        await asyncio.sleep(ctx.settings.quota_tick_seconds)
