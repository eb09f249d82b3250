"""How an Episode ends: its final status (one compare-and-swap), every job cancelled, the ledger
entries of jobs deleted unsettled settled, its backend's per-episode resources released once every
job is confirmed gone, and its provenance summarised; also its deletion."""

from __future__ import annotations

import logging
from collections.abc import Collection
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api import provenance
from posttrain_operator.api.episode import EpisodeStatus, Integrity, ProvenanceSummary
from posttrain_operator.api.models import AgentJobStatus, Outcome, ScoreInterval, status_of
from posttrain_operator.api.rules import ENDED_PHASES, format_time, parse_time
from posttrain_operator.backends.base import SupportsEpisodeCleanup
from posttrain_operator.reconcile.cancellation import cancel_all
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.finishing import announce_settled_at_reservation, release_reservation

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class End:
    outcome: Outcome
    reward: str | None
    message: str
    phase: str = "Completed"
    reward_interval: ScoreInterval | None = None
    integrity: Integrity | None = None


def vanished_jobs(status: EpisodeStatus, listed: Collection[str]) -> list[str]:
    """The jobs an ended Episode's ledger holds a reservation for although their AgentJob is gone:
    not in `listed`, the names of its AgentJobs as listed after it ended. Such a job was deleted
    without the operator settling it (its finalizer removed by hand, so no delete handler ran).

    An ended Episode admits no job, so its ledger takes no new entry, and every entry was made for a
    job that existed when it was made: a job missing from a list read after the end is gone for good.
    A running Episode is never judged (empty). Orphans are left to orphan collection, which has their
    backend job's id."""
    if status.phase not in ENDED_PHASES:
        return []
    orphaned = {o.name for o in status.orphaned_jobs}
    return sorted(
        name
        for name, entry in status.ledger.entries.items()
        if entry.settled_micro_usd is None and name not in orphaned and name not in listed
    )


async def set_status(ctx: Context, body: dict[str, Any], **update: Any) -> None:
    """Set status fields of the Episode this pass read as `body` (one compare-and-swap)."""
    meta = body["metadata"]

    def mutate(_: dict[str, Any], current: EpisodeStatus) -> tuple[EpisodeStatus | None, None]:
        new = current.model_copy(update=update)
        return (None if new == current else new), None

    await ctx.kube.update_episode_status(meta["namespace"], meta["name"], mutate, seen=body)


async def fail_episode(
    ctx: Context, body: dict[str, Any], status: EpisodeStatus, reason: str, message: str
) -> None:
    """An Episode that cannot run at all (unknown task, backend not enabled) ends Failed at once."""
    conditions, _ = ctx.set_condition(body, status.conditions, cond.READY, False, reason, message)
    conditions, _ = ctx.set_condition(body, conditions, cond.ENDED, True, reason, message)
    await set_status(
        ctx, body, phase="Failed", message=message, ended_at=format_time(ctx.clock()), conditions=conditions
    )
    ctx.emit(body, "Warning", reason, message)


def still_ends(end: End, decided_in: str | None, fresh: dict[str, Any], current: EpisodeStatus) -> bool:
    """Whether `end`, decided on an Episode in phase `decided_in`, still applies to the Episode as the
    compare-and-swap read it: nobody moved its phase on since, and an end for a limit finds no
    submission (one that landed first is scored; the API server takes none once the phase moved)."""
    if current.phase != decided_in:
        return False
    return end.outcome != "LimitReached" or not (fresh.get("spec") or {}).get("submission")


async def end_episode(ctx: Context, body: dict[str, Any], end: End) -> None:
    """End the Episode as `end` says, unless what it was decided on changed before the write (the
    next pass then decides again)."""
    decided_in = status_of(EpisodeStatus, body.get("status")).phase

    def ending(fresh: dict[str, Any], current: EpisodeStatus) -> tuple[EpisodeStatus | None, None]:
        if not still_ends(end, decided_in, fresh, current):
            return None, None
        why = (end.outcome, end.message)
        conditions, _ = ctx.set_condition(fresh, current.conditions, cond.READY, False, *why)
        conditions, _ = ctx.set_condition(fresh, conditions, cond.ENDED, True, *why)
        update = {"phase": end.phase, "outcome": end.outcome, "reward": end.reward, "message": end.message,
                  "reward_interval": end.reward_interval, "integrity": end.integrity,
                  "ended_at": format_time(ctx.clock()),
                  "conditions": conditions}  # fmt: skip
        return current.model_copy(update=update), None

    meta = body["metadata"]
    written = await ctx.kube.update_episode_status(meta["namespace"], meta["name"], ending, seen=body)
    if not written.written:
        return
    clean = end.outcome == "Scored" and (end.integrity is None or end.integrity.label == "clean")
    ctx.emit(body, "Normal" if clean else "Warning", end.outcome, end.message)
    if await cancel_all(ctx, body, cond.EPISODE_ENDED, f"episode ended: {end.message}"):
        await release_backend_resources(ctx, body)


async def settle_ended(ctx: Context, body: dict[str, Any]) -> bool:
    """A pass over an ended Episode whose ledger still holds reservations: the entries of jobs that are
    gone are settled, those of jobs rejected holding one released, and the jobs not finished are
    cancelled (which settles them), from one list of its jobs. True when every cancellation is
    confirmed."""
    meta = body["metadata"]
    jobs = await ctx.kube.list_agentjobs(meta["namespace"], meta["name"])
    await settle_vanished(ctx, body, {job["metadata"]["name"] for job in jobs})
    for name in refused_holding(status_of(EpisodeStatus, body.get("status")), jobs):
        await release_reservation(ctx, meta["namespace"], meta["name"], name)
    return await cancel_all(ctx, body, cond.EPISODE_ENDED, "the episode ended", jobs=jobs)


def refused_holding(status: EpisodeStatus, jobs: list[dict[str, Any]]) -> list[str]:
    """The `Rejected` jobs among `jobs` that the ledger still holds a reservation for. Admission now
    releases one before it rejects; an operator before that did not, when the pass resuming an
    admission refused the job. Never submitted, such a job owes nothing, and its entry would keep the
    ended Episode from releasing its backend and sealing its provenance."""
    holding = ledger_math.unsettled(status.ledger)
    return sorted(
        job["metadata"]["name"]
        for job in jobs
        if job["metadata"]["name"] in holding
        and status_of(AgentJobStatus, job.get("status")).phase == "Rejected"
    )


async def settle_vanished(ctx: Context, body: dict[str, Any], listed: Collection[str]) -> None:
    """Settle every entry `vanished_jobs` finds in one compare-and-swap, decided again on the status it
    swaps (a settlement that got there first stands), and say so in an Event."""
    # At the reservation, the worst case: the real minutes went with the AgentJob's status, and so did
    # its backend job's id, so the backend cannot be asked; the job may have run, and on HF Jobs may
    # still run up to its timeout (the pods backend's pods go with the episode's namespace). Anything
    # less could show a spend below the bill; moving the reservation to settled keeps the invariant.
    meta = body["metadata"]

    def settle(
        _: dict[str, Any], current: EpisodeStatus
    ) -> tuple[EpisodeStatus | None, ledger_math.Settlement]:
        settled = ledger_math.settle_at_reservation(current.ledger, vanished_jobs(current, listed))
        return (current.model_copy(update={"ledger": settled.ledger}) if settled.changed else None), settled

    update = await ctx.kube.update_episode_status(meta["namespace"], meta["name"], settle, seen=body)
    if update.written:
        announce_settled_at_reservation(ctx, body, update.result)


async def release_backend_resources(ctx: Context, body: dict[str, Any]) -> bool:
    """Per-episode backend resources go once every job is confirmed gone; True once they are gone.
    A failure is logged; the ended Episode's next pass (or its deletion) tries again."""
    backend = ctx.backends.get(body["spec"]["backend"])
    if not isinstance(backend, SupportsEpisodeCleanup):
        return True
    meta = body["metadata"]
    try:
        return await backend.release_episode(meta["namespace"], meta["name"])
    except Exception as exc:
        log.warning("releasing %s/%s on its backend failed: %s", meta["namespace"], meta["name"], exc)
        return False


def provenance_sealed(summary: ProvenanceSummary, status: EpisodeStatus, now: datetime, grace: float) -> bool:
    """Whether an ended Episode's summary may be written: once the gateway's record holds as many tool
    calls as it counted, or, should it never (a gateway that stopped mid-call), `grace` seconds after
    the end; the summary then shows the shortfall against status.steps."""
    ended = parse_time(status.ended_at)
    return summary.tool_calls >= status.steps or ended is None or now >= ended + timedelta(seconds=grace)


async def seal_provenance(ctx: Context, body: dict[str, Any]) -> None:
    """Summarise an ended Episode's provenance records in its status, once every job is settled (so
    every job is recorded: a job's record is written before its terminal status)."""
    meta = body["metadata"]
    records = await ctx.kube.list_provenance(meta["namespace"], meta["name"])
    summary = provenance.summarise(provenance.specs_of(records))
    status = status_of(EpisodeStatus, body.get("status"))
    if provenance_sealed(summary, status, ctx.clock(), ctx.settings.provenance_grace_seconds):
        await set_status(ctx, body, provenance=summary)


async def finalize_episode(ctx: Context, namespace: str, name: str) -> bool:
    """On deletion: cancel every job; True once all are confirmed (the finalizer may then go)."""
    body = await ctx.kube.get_episode(namespace, name)
    if body is None:
        return True
    if not await cancel_all(ctx, body, cond.EPISODE_ENDED, "the episode was deleted"):
        return False
    await release_backend_resources(ctx, body)
    return True
