"""How an Episode ends: its final status (one compare-and-swap), every job cancelled, and its
backend's per-episode resources released once those are confirmed gone; also its deletion."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import EpisodeStatus, Outcome, status_of
from posttrain_operator.api.rules import format_time
from posttrain_operator.backends.base import SupportsEpisodeCleanup
from posttrain_operator.reconcile.cancellation import cancel_all
from posttrain_operator.reconcile.context import Context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class End:
    outcome: Outcome
    reward: str | None
    message: str
    phase: str = "Completed"


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


async def end_episode(ctx: Context, body: dict[str, Any], end: End) -> None:
    status = status_of(EpisodeStatus, body.get("status"))
    conditions, _ = ctx.set_condition(body, status.conditions, cond.READY, False, end.outcome, end.message)
    conditions, _ = ctx.set_condition(body, conditions, cond.ENDED, True, end.outcome, end.message)
    await set_status(
        ctx,
        body,
        phase=end.phase,
        outcome=end.outcome,
        reward=end.reward,
        message=end.message,
        ended_at=format_time(ctx.clock()),
        conditions=conditions,
    )
    ctx.emit(body, "Normal" if end.outcome == "Scored" else "Warning", end.outcome, end.message)
    if await cancel_all(ctx, body, cond.EPISODE_ENDED, f"episode ended: {end.message}"):
        await release_backend_resources(ctx, body)


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


async def finalize_episode(ctx: Context, namespace: str, name: str) -> bool:
    """On deletion: cancel every job; True once all are confirmed (the finalizer may then go)."""
    body = await ctx.kube.get_episode(namespace, name)
    if body is None:
        return True
    if not await cancel_all(ctx, body, cond.EPISODE_ENDED, "the episode was deleted"):
        return False
    await release_backend_resources(ctx, body)
    return True
