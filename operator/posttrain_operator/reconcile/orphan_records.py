"""The Episode's list of orphaned jobs and its `Orphaned` condition: pure updates of its status."""

from __future__ import annotations

from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import EpisodeStatus
from posttrain_operator.reconcile.context import Context


def orphan_condition(ctx: Context, episode: dict[str, Any], status: EpisodeStatus) -> EpisodeStatus:
    names = ", ".join(o.name for o in status.orphaned_jobs)
    conditions = ctx.set_condition(
        episode,
        status.conditions,
        cond.ORPHANED,
        bool(status.orphaned_jobs),
        cond.ORPHANED_JOBS if status.orphaned_jobs else "AllConfirmed",
        f"cancellation not confirmed for: {names}" if names else "every cancellation is confirmed",
    )
    return status.model_copy(update={"conditions": conditions})


def without_orphan(ctx: Context, episode: dict[str, Any], status: EpisodeStatus, name: str) -> EpisodeStatus:
    orphans = [o for o in status.orphaned_jobs if o.name != name]
    return orphan_condition(ctx, episode, status.model_copy(update={"orphaned_jobs": orphans}))
