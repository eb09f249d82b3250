"""Orphan collection: retry each orphaned job's cancellation when it is due, backing off
exponentially between attempts, until the backend confirms."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import EpisodeStatus, status_of
from posttrain_operator.api.rules import format_time, parse_time
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.orphan_records import orphan_condition


async def collect_orphans(ctx: Context, namespace: str, name: str) -> None:
    """Retry each due orphan's cancellation, with exponential backoff between attempts."""
    body = await ctx.kube.get_episode(namespace, name)
    if body is None:
        return
    status = status_of(EpisodeStatus, body.get("status"))
    now = ctx.clock()
    for orphan in status.orphaned_jobs:
        due = parse_time(orphan.next_attempt_at)
        if due is not None and now < due:
            continue
        async with ctx.locks("agentjob", namespace, orphan.name):
            confirmed = await cancel_agentjob(
                ctx, namespace, orphan.name, cond.EPISODE_ENDED, "orphan collected"
            )
        if confirmed:
            ctx.emit(body, "Normal", "OrphanCollected", f"backend confirmed cancellation of {orphan.name}")
            continue
        delay = min(
            ctx.settings.orphan_retry_max_seconds,
            ctx.settings.orphan_retry_initial_seconds * 2 ** min(orphan.attempts, 16),
        )

        def bump(
            episode: dict[str, Any], current: EpisodeStatus, job: str = orphan.name, wait: float = delay
        ) -> EpisodeStatus | None:
            due = format_time(now + timedelta(seconds=wait))
            orphans = [
                o.model_copy(update={"attempts": o.attempts + 1, "next_attempt_at": due})
                if o.name == job
                else o
                for o in current.orphaned_jobs
            ]
            return orphan_condition(ctx, episode, current.model_copy(update={"orphaned_jobs": orphans}))

        await ctx.kube.update_episode_status(namespace, name, bump)
