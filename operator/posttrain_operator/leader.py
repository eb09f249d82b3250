"""One active operator per release: a coordination.k8s.io Lease, as Kubernetes' own controllers use.

A replica that does not hold the Lease stands by (its broker answers liveness but not readiness) and
takes over once the holder has not renewed for a whole lease duration, measured on this process's own
clock from when it last saw the record change (no trust in another host's clock). A leader that cannot
renew within that duration exits at once: by then another replica may be acting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from posttrain_operator.k8s import Kube

log = logging.getLogger(__name__)

Move = Literal["create", "take", "renew", "wait"]


@dataclass(frozen=True)
class Seen:
    """The holder's record as last seen, and when (this process's monotonic clock)."""

    holder: str
    renew_time: str
    at: float


def decide(lease: dict[str, Any] | None, me: str, seen: Seen | None, now: float, duration: float) -> Move:
    """Pure: what to do with the Lease as read. `seen` must already reflect this read (see observe)."""
    if lease is None:
        return "create"
    holder = (lease.get("spec") or {}).get("holderIdentity") or ""
    if holder == me:
        return "renew"
    if not holder:  # released by a leader that shut down cleanly
        return "take"
    if seen is not None and now - seen.at >= duration:
        return "take"
    return "wait"


def observe(lease: dict[str, Any] | None, seen: Seen | None, now: float) -> Seen | None:
    """The record as now seen: its time moves only when the holder or its renewTime changed."""
    if lease is None:
        return None
    spec = lease.get("spec") or {}
    holder, renew = spec.get("holderIdentity") or "", spec.get("renewTime") or ""
    if seen is not None and (seen.holder, seen.renew_time) == (holder, renew):
        return seen
    return Seen(holder, renew, now)


def _micro_time() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Leadership:
    def __init__(
        self,
        kube: Kube,
        namespace: str,
        name: str,
        identity: str,
        duration: float,
        renew_every: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.kube, self.namespace, self.name, self.identity = kube, namespace, name, identity
        self.duration, self.renew_every, self.clock = duration, renew_every, clock
        self.seen: Seen | None = None
        self.leading = False
        self.renewed_at = 0.0

    def _body(self, lease: dict[str, Any] | None, move: Move) -> dict[str, Any]:
        now = _micro_time()
        spec = dict((lease or {}).get("spec") or {})
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if lease is not None:
            meta["resourceVersion"] = lease["metadata"]["resourceVersion"]
        if move != "renew":
            spec["acquireTime"] = now
            spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + (lease is not None)
        spec.update(holderIdentity=self.identity, leaseDurationSeconds=int(self.duration), renewTime=now)
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    async def try_once(self) -> bool:
        """One read and at most one write; True while this process holds the Lease."""
        lease = await self.kube.get_lease(self.namespace, self.name)
        now = self.clock()
        self.seen = observe(lease, self.seen, now)
        move = decide(lease, self.identity, self.seen, now, self.duration)
        if move == "wait":
            self.leading = False
            return False
        self.leading = await self.kube.write_lease(self.namespace, self._body(lease, move))
        if self.leading:
            self.renewed_at = now
            if move != "renew":
                log.info("became the leader (Lease %s/%s, as %s)", self.namespace, self.name, self.identity)
        return self.leading

    async def acquire(self, retry_every: float) -> None:
        """Stand by until this process holds the Lease."""
        announced = False
        while not await self._try_quietly():
            if not announced and self.seen is not None:
                log.info(
                    "standing by: Lease %s/%s is held by %s", self.namespace, self.name, self.seen.holder
                )
                announced = True
            await asyncio.sleep(retry_every)

    async def _try_quietly(self) -> bool:
        try:
            return await self.try_once()
        except Exception as exc:  # the API server is unreachable: keep standing by (or keep trying)
            log.warning("Lease %s/%s: %s", self.namespace, self.name, exc)
            return False

    async def keep(self, on_lost: Callable[[str], None]) -> None:
        """Renew until cancelled; call `on_lost` once the Lease is held by another or has not been
        renewed for a whole duration."""
        while True:
            await asyncio.sleep(self.renew_every)
            if await self._try_quietly():
                continue
            if self.seen is not None and self.seen.holder not in ("", self.identity):
                on_lost(f"the Lease is now held by {self.seen.holder}")
                return
            if self.clock() - self.renewed_at >= self.duration:
                on_lost(f"the Lease was not renewed for {self.duration:.0f}s")
                return

    async def release(self) -> None:
        """On a clean shutdown: hand over at once instead of after a lease duration."""
        if not self.leading:
            return
        lease = await self.kube.get_lease(self.namespace, self.name)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        lease["spec"]["holderIdentity"] = ""
        await self.kube.write_lease(self.namespace, lease)
        self.leading = False
