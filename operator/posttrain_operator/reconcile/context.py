"""What every reconciler needs, injected once at start-up (tests build their own)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from posttrain_operator.api.conditions import set_condition
from posttrain_operator.api.episode import JobNetwork
from posttrain_operator.api.models import Condition
from posttrain_operator.api.rules import format_time, now_utc
from posttrain_operator.backends.base import CREDENTIALS_MISSING, CREDENTIALS_REJECTED, Backend, Health
from posttrain_operator.config import OperatorSettings
from posttrain_operator.k8s import Kube
from posttrain_operator.metrics import OperatorMetrics

CREDENTIAL_REASONS = frozenset({CREDENTIALS_REJECTED, CREDENTIALS_MISSING})
# Each namespace's orphaned jobs: one tuple of "episode/job" per Episode that records any.
NamespaceOrphans = Mapping[str, Iterable[tuple[str, ...]]]
EventSink = Callable[[dict[str, Any], str, str, str], None]


class KeyedLocks:
    """One asyncio.Lock per object, so two handlers never act on the same object at once."""

    def __init__(self) -> None:
        self._locks: dict[tuple[str, ...], asyncio.Lock] = {}

    def __call__(self, *key: str) -> asyncio.Lock:
        return self._locks.setdefault(key, asyncio.Lock())


class BackendNotEnabled(LookupError):
    """An Episode names a backend this operator does not run (not enabled, or misspelt config)."""

    reason = "BackendNotEnabled"

    def __init__(self, name: str, enabled: list[str]) -> None:
        super().__init__(
            f"backend {name!r} is not enabled in this operator (enabled: {', '.join(enabled) or 'none'})"
        )


def _no_events(body: dict[str, Any], type_: str, reason: str, message: str) -> None:
    return None


@dataclass
class Context:
    kube: Kube
    backends: dict[str, Backend]
    settings: OperatorSettings
    clock: Callable[[], datetime] = now_utc
    locks: KeyedLocks = field(default_factory=KeyedLocks)
    emit: EventSink = _no_events
    # Each backend's credential check, from start-up, updated when a call is refused.
    health: dict[str, Health] = field(default_factory=dict)
    # True while another replica holds the leader's Lease: this one acts on nothing.
    standby: bool = False
    metrics: OperatorMetrics = field(default_factory=OperatorMetrics)
    # Each running Episode as its watch last delivered it (kopf's live body, swapped whole per event):
    # admission starts from it instead of a read, and its compare-and-swap proves it current.
    watched_episodes: dict[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    # The namespaces' orphans from the watch (kopf's index `handlers.namespace_orphans`: no handler runs
    # before every Episode is in it). A new Episode waits on them.
    namespace_orphans: NamespaceOrphans = field(default_factory=dict)

    def set_condition(
        self,
        body: dict[str, Any],
        conditions: list[Condition],
        type_: str,
        ok: bool,
        reason: str,
        message: str,
    ) -> tuple[list[Condition], bool]:
        """`conditions` with one set, stamped with this clock and the object's generation, and
        whether anything changed."""
        generation = int(body["metadata"].get("generation", 1))
        return set_condition(conditions, type_, ok, reason, message, format_time(self.clock()), generation)

    def backend(self, name: str) -> Backend:
        try:
            return self.backends[name]
        except KeyError:
            raise BackendNotEnabled(name, sorted(self.backends)) from None

    def sandboxed_flavors(self, backend: str) -> frozenset[str]:
        """The flavors of `backend` whose jobs run under a sandboxing runtime (pods only)."""
        if backend != "pods":
            return frozenset()
        sandboxes = set(self.settings.pods_sandbox_runtime_classes)
        flavors = self.settings.pods_flavors.items()
        return frozenset(name for name, f in flavors if f.runtime_class_name in sandboxes)

    def job_network(self, backend: str) -> JobNetwork:
        """What agent jobs on `backend` may do on the network, and why."""
        if backend == "hf-jobs" and self.settings.hf_jobs_loopback:
            return JobNetwork(
                mode="loopback",
                reason="each job runs in a network namespace holding lo alone (hfJobs.loopbackOnly); "
                "its launcher checks that before any job code runs",
            )
        if backend == "hf-jobs":
            return JobNetwork(
                mode="unix",
                reason="HF Jobs gives a job the network, so the launcher refuses every socket but AF_UNIX",
            )
        if self.settings.pods_loopback_seccomp_profile:
            return JobNetwork(
                mode="loopback",
                reason="each job's launcher, after its egress check, makes a user and network namespace "
                "holding lo alone for the job (seccomp profile "
                f"{self.settings.pods_loopback_seccomp_profile}) and refuses the job if it cannot",
            )
        return JobNetwork(
            mode="unix",
            reason="a job pod shares its pod's network (fenced by NetworkPolicy) and the nodes have no "
            "loopback seccomp profile (pods.loopbackSeccompProfile), so the launcher refuses every "
            "socket but AF_UNIX",
        )

    def note_failure(self, name: str, reason: str, message: str) -> None:
        """A refused credential seen on any call is what readiness reports from then on."""
        if reason in CREDENTIAL_REASONS:
            self.health[name] = Health(reason, message)
