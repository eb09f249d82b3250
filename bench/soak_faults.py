"""The chaos soaks' seeded timeline (when the operator is killed, the API server or the kubelet
restarted, a backend fault injected, an Episode ended early) and the backend faults it draws from."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from devstack.hf_emulator import Fault, routes

# The calls the operator makes on HF Jobs while jobs come and go, and how they are shown.
FAULT_ROUTES = {
    routes.CREATE_JOB: "create",
    routes.INSPECT_JOB: "inspect",
    routes.LIST_JOBS: "list",
    routes.CANCEL_JOB: "cancel",
}
CLIENT_TIMEOUT = 5.0  # the operator's HF client timeout in the soak (POSTTRAIN_HF_HTTP_TIMEOUT_SECONDS)


def backend_fault(rng: random.Random) -> Fault:
    """One request fault on one of the operator's calls: a 5xx, a 429, a dropped connection, a lost
    response (the request took effect, no answer came), a hang past the client's timeout, or a slow
    answer; it applies to the next one to three such requests."""
    route = rng.choice(list(FAULT_ROUTES))
    kind = rng.choice(["http_error", "http_error", "rate_limit", "drop", "lose_response", "hang", "delay"])
    count = rng.randint(1, 3)
    if kind == "http_error":
        return Fault(kind, route=route, count=count, status=rng.choice([500, 502, 503, 504]))
    if kind == "rate_limit":
        return Fault(kind, route=route, count=count, seconds=rng.choice([0, 1, 2]))
    if kind == "hang":
        return Fault(kind, route=route, count=count, seconds=CLIENT_TIMEOUT + 3)
    if kind == "delay":
        return Fault(kind, route=route, count=count, seconds=rng.uniform(0.5, CLIENT_TIMEOUT - 1))
    return Fault(kind, route=route, count=count)


@dataclass(frozen=True)
class Timeline:
    """(seconds from the start, action) in order; actions: kill, apiserver, kubelet, fault, delete,
    submit."""

    events: list[tuple[float, str]]

    @classmethod
    def draw(
        cls, rng: random.Random, seconds: float, *, kills: int, apiserver_restarts: int, faults: int,
        episodes: int, kubelet_restarts: int = 0,
    ) -> Timeline:  # fmt: skip
        # Kills and restarts in the middle 80%, apart from each other by construction of a sorted draw;
        # faults evenly spread with jitter; about a quarter of the Episodes ended early.
        events = [(rng.uniform(0.1, 0.9) * seconds, "kill") for _ in range(kills)]
        events += [(rng.uniform(0.15, 0.85) * seconds, "apiserver") for _ in range(apiserver_restarts)]
        step = seconds / max(1, faults)
        events += [(i * step + rng.uniform(0, step), "fault") for i in range(faults)]
        endings = episodes // 4
        events += [
            (rng.uniform(0.2, 0.9) * seconds, rng.choice(["delete", "submit"])) for _ in range(endings)
        ]
        # Drawn last: a timeline without them draws what it drew before they existed.
        events += [(rng.uniform(0.15, 0.85) * seconds, "kubelet") for _ in range(kubelet_restarts)]
        return cls(sorted(events))

    def count(self, action: str) -> int:
        return sum(1 for _, a in self.events if a == action)

    async def run(
        self, act: Callable[[str], Awaitable[None]], failed: Callable[[str, float, Exception], None]
    ) -> None:
        """Each action at its moment from now; one that fails goes to `failed`, never ends the soak."""
        started = time.monotonic()
        for at, action in self.events:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            try:
                await act(action)
            except Exception as exc:
                failed(action, at, exc)
