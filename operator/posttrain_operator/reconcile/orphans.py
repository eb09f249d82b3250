"""Orphan collection: retry each orphaned job's cancellation when it is due, backing off
exponentially between attempts (see `orphan_records.retry_delay`), until the backend confirms."""

from __future__ import annotations

from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import EpisodeStatus, status_of
from posttrain_operator.api.rules import parse_time
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.orphan_records import retried


async def collect_orphans(ctx: Context, namespace: str, name: str) -> None:
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

        def later(
            episode: dict[str, Any], current: EpisodeStatus, job: str = orphan.name
        ) -> tuple[EpisodeStatus | None, None]:
            return retried(ctx, episode, current, job), None

        await ctx.kube.update_episode_status(namespace, name, later)
