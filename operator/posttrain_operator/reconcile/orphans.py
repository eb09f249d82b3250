"""Orphan collection: retry each orphaned job's cancellation when it is due, backing off
exponentially between attempts (see `orphan_records.retry_delay`), until the backend confirms. An
orphan whose AgentJob is gone is cancelled by the backend job id its Episode recorded."""

from __future__ import annotations

from typing import Any

from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeStatus, OrphanedJob
from posttrain_operator.api.models import status_of
from posttrain_operator.api.rules import parse_time
from posttrain_operator.backends.base import BackendError, Handle
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.finishing import announce_settled_at_reservation, unlist_orphan
from posttrain_operator.reconcile.orphan_records import retried, without_orphan


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
            if await ctx.kube.get_agentjob(namespace, orphan.name) is None:
                confirmed = await _collect_vanished(ctx, body, orphan)
            else:
                confirmed = await cancel_agentjob(
                    ctx, namespace, orphan.name, cond.EPISODE_ENDED, "orphan collected"
                )
        if confirmed:
            # Finishing the job unlisted it; a job found finished already (the operator stopped between
            # its terminal write and the unlisting) is unlisted here.
            await unlist_orphan(ctx, namespace, name, orphan.name)
            ctx.emit(body, "Normal", "OrphanCollected", f"backend confirmed cancellation of {orphan.name}")
            continue

        def later(
            episode: dict[str, Any], current: EpisodeStatus, job: str = orphan.name
        ) -> tuple[EpisodeStatus | None, None]:
            return retried(ctx, episode, current, job), None

        await ctx.kube.update_episode_status(namespace, name, later)


def settled_vanished_orphan(
    ctx: Context, episode: dict[str, Any], status: EpisodeStatus, name: str
) -> tuple[EpisodeStatus | None, ledger_math.Settlement]:
    """The orphan `name`, whose AgentJob is gone and whose backend job is confirmed stopped, settled at
    its reservation and off the list (None when that is done already), and what that settled."""
    # At the reservation, the worst case: the job's flavor, and so its price per minute, went with
    # the AgentJob, so the minutes the backend reports cannot be priced.
    settled = ledger_math.settle_at_reservation(status.ledger, [name])
    new = status.model_copy(update={"ledger": settled.ledger}) if settled.changed else status
    new = without_orphan(ctx, episode, new, name) or new
    return (None if new is status else new), settled


async def _collect_vanished(ctx: Context, body: dict[str, Any], orphan: OrphanedJob) -> bool:
    """An orphan whose AgentJob was deleted unsettled (its finalizer removed by hand): cancel its
    backend job by the id the Episode recorded; once that is confirmed, settle it (one
    compare-and-swap). True when confirmed."""
    backend = ctx.backends.get(body["spec"]["backend"])
    if backend is None:
        return False  # not enabled here: nothing can confirm it, so it is retried with backoff
    if orphan.backend_job_id:  # none recorded: nothing was ever submitted, so nothing to cancel
        try:
            if not await backend.cancel(Handle(orphan.backend_job_id)):
                return False
        except BackendError:
            return False
    meta = body["metadata"]

    def settle(
        episode: dict[str, Any], current: EpisodeStatus
    ) -> tuple[EpisodeStatus | None, ledger_math.Settlement]:
        # Nothing settled (another pass got there first) leaves it at most taken off the list.
        return settled_vanished_orphan(ctx, episode, current, orphan.name)

    update = await ctx.kube.update_episode_status(meta["namespace"], meta["name"], settle, seen=body)
    if update.written and update.result.changed:
        announce_settled_at_reservation(ctx, body, update.result)
    return True
