"""New AgentJobs admitted as soon as the API server announces them, ahead of kopf.

kopf handles a watch event tens of milliseconds after it arrives, and a new job waits on that
before anything is reserved for it; an admission itself is three round trips. So the operator also
watches job creations itself and begins the pass at once. This is only an accelerator: kopf's create
handler runs the same idempotent pass under the same per-job lock, so a job this skips (too many in
flight, a broken watch) or fails on is admitted there, as it would be without it."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from posttrain_operator.reconcile.admission import admit_created
from posttrain_operator.reconcile.context import Context

log = logging.getLogger(__name__)
RESTART_SECONDS = 5.0


def unclaimed(job: dict[str, Any], finalizer: str) -> bool:
    """A job no pass has begun on: no status, not being deleted, and without our finalizer yet."""
    meta = job.get("metadata") or {}
    return (
        not (job.get("status") or {}).get("phase")
        and not meta.get("deletionTimestamp")
        and finalizer not in (meta.get("finalizers") or [])
    )


class EarlyAdmission:
    def __init__(self, ctx: Context, limit: int) -> None:
        self._ctx = ctx
        self._limit = limit
        self._passes: set[asyncio.Task[None]] = set()

    async def watch(self, namespace: str | None) -> None:
        """Offer every job created in `namespace` (None: all) until cancelled."""
        log.info("admitting new jobs in %s ahead of kopf", namespace or "every namespace")
        while True:
            try:
                async for job in self._ctx.kube.created_agentjobs(namespace):
                    self.offer(job)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # meanwhile kopf admits alone
                log.warning("early admission's watch failed (%s); again in %.0fs", exc, RESTART_SECONDS)
                await asyncio.sleep(RESTART_SECONDS)

    def offer(self, job: dict[str, Any]) -> None:
        """Begin a pass on `job` (as the watch announced it) unless it needs none or too many run:
        under a burst, kopf's handlers share the work."""
        if len(self._passes) >= self._limit or not unclaimed(job, self._ctx.settings.finalizer):
            return
        task = asyncio.create_task(self._admit(job))
        self._passes.add(task)
        task.add_done_callback(self._passes.discard)

    async def _admit(self, job: dict[str, Any]) -> None:
        meta = job["metadata"]
        try:
            await admit_created(self._ctx, job)
        except Exception as exc:  # kopf's handler runs the pass again, with its retries and backoff
            log.debug("early admission of %s/%s left to kopf: %s", meta["namespace"], meta["name"], exc)

    async def close(self) -> None:
        for task in list(self._passes):
            task.cancel()
        await asyncio.gather(*self._passes, return_exceptions=True)
