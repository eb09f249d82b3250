"""The Episode's list of orphaned jobs and its `Orphaned` condition. Pure updates of its status (the
clock and the generation come from the context and the Episode): each returns the new status, or None
when there is nothing to change."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import timedelta
from typing import Any

from pydantic import TypeAdapter

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeStatus, OrphanedJob
from posttrain_operator.api.rules import format_time
from posttrain_operator.config import OperatorSettings
from posttrain_operator.reconcile.context import Context, NamespaceOrphans

_ORPHANS = TypeAdapter(list[OrphanedJob])


def orphans_index_entry(namespace: str, name: str, status: Mapping[str, Any]) -> dict[str, tuple[str, ...]]:
    """An Episode's entry in the index of its namespace's orphans; empty, not None, when it has none:
    kopf keeps an object's earlier entries when its index handler returns None. Only the list is
    parsed, since the index sees every event of every Episode."""
    listed = status.get("orphanedJobs")
    if not listed:
        return {}
    return {namespace: tuple(f"{name}/{orphan.name}" for orphan in _ORPHANS.validate_python(listed))}


def orphans_blocking(index: NamespaceOrphans, namespace: str, name: str) -> list[str]:
    """The orphans recorded by the namespace's other Episodes, as "episode/job"."""
    return sorted(
        orphan for entry in index.get(namespace, ()) for orphan in entry if not orphan.startswith(f"{name}/")
    )


def retry_delay(settings: OperatorSettings, attempts: int) -> float:
    """Seconds before the next cancellation attempt: doubling from the first, up to the maximum."""
    doublings = min(max(attempts - 1, 0), 16)
    return min(settings.orphan_retry_max_seconds, settings.orphan_retry_initial_seconds * (1 << doublings))


def _with_condition(ctx: Context, episode: dict[str, Any], status: EpisodeStatus) -> EpisodeStatus:
    names = ", ".join(o.name for o in status.orphaned_jobs)
    conditions, _ = ctx.set_condition(
        episode,
        status.conditions,
        cond.ORPHANED,
        bool(status.orphaned_jobs),
        cond.ORPHANED_JOBS if status.orphaned_jobs else "AllConfirmed",
        f"cancellation not confirmed for: {names}" if names else "every cancellation is confirmed",
    )
    return status.model_copy(update={"conditions": conditions})


def with_orphan(
    ctx: Context, episode: dict[str, Any], status: EpisodeStatus, name: str, backend_job_id: str
) -> EpisodeStatus | None:
    """`name` listed as orphaned, its first retry due after the initial delay."""
    if any(o.name == name for o in status.orphaned_jobs):
        return None
    now = ctx.clock()
    entry = OrphanedJob(
        name=name,
        backend_job_id=backend_job_id,
        since=format_time(now),
        attempts=1,
        next_attempt_at=format_time(now + timedelta(seconds=retry_delay(ctx.settings, 1))),
    )
    return _with_condition(
        ctx, episode, status.model_copy(update={"orphaned_jobs": [*status.orphaned_jobs, entry]})
    )


def without_orphan(
    ctx: Context, episode: dict[str, Any], status: EpisodeStatus, name: str
) -> EpisodeStatus | None:
    """`name` no longer listed (its cancellation is confirmed)."""
    if not any(o.name == name for o in status.orphaned_jobs):
        return None
    orphans = [o for o in status.orphaned_jobs if o.name != name]
    return _with_condition(ctx, episode, status.model_copy(update={"orphaned_jobs": orphans}))


def retried(ctx: Context, episode: dict[str, Any], status: EpisodeStatus, name: str) -> EpisodeStatus | None:
    """One more failed attempt for `name`, the next one due after a doubled delay."""
    now = ctx.clock()
    orphans = []
    for orphan in status.orphaned_jobs:
        if orphan.name == name:
            wait = retry_delay(ctx.settings, orphan.attempts + 1)
            due = format_time(now + timedelta(seconds=wait))
            orphan = orphan.model_copy(update={"attempts": orphan.attempts + 1, "next_attempt_at": due})
        orphans.append(orphan)
    if orphans == status.orphaned_jobs:
        return None
    return _with_condition(ctx, episode, status.model_copy(update={"orphaned_jobs": orphans}))
