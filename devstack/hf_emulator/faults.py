"""Run-time fault injection.

Two families:
- request faults (`http_error`, `rate_limit`, `delay`, `hang`, `drop`, `lose_response`) apply to
  requests whose route key (`"GET /api/jobs/{namespace}"`, see `routes.py`) matches `route` (None =
  every API route). `drop` closes the connection before the request is processed; `lose_response`
  processes it (a job is created, a cancel honoured) and then closes without answering, the case
  that tempts a client into submitting twice. A `delay`ed or `hang`ing request is processed when
  it ends, even if the client has given up by then, as a slow server would;
- job faults (`cancel_ignored`, `job_error`, `job_vanish`) apply to jobs selected by `job_id` and/or
  a `labels` subset (neither = any job), either already existing or created later.
`count` is how many requests (or jobs) a fault applies to before it expires; None = until cleared.
"""

from __future__ import annotations

import itertools
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

REQUEST_FAULTS = ("http_error", "rate_limit", "delay", "hang", "drop", "lose_response")
JOB_FAULTS = ("cancel_ignored", "job_error", "job_vanish")
FAULT_KINDS = REQUEST_FAULTS + JOB_FAULTS


@dataclass
class Fault:
    kind: str
    route: str | None = None
    count: int | None = 1
    status: int = 500  # http_error
    seconds: float = 0.0  # delay: added latency; hang: maximum; rate_limit: reset (t=); job faults: delay
    message: str = "injected failure"  # job_error's status message; http_error's body
    job_id: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    id: int = 0
    hits: int = 0

    def __post_init__(self) -> None:
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind must be one of {FAULT_KINDS}, not {self.kind!r}")
        if self.count is not None and self.count < 1:
            raise ValueError("count must be >= 1 or None (persistent)")
        if self.kind == "http_error" and not 400 <= self.status <= 599:
            raise ValueError("http_error status must be a 4xx or 5xx code")

    @classmethod
    def from_wire(cls, data: dict[str, Any]) -> Fault:
        allowed = {"kind", "route", "count", "status", "seconds", "message", "job_id", "labels"}
        unknown = set(data) - allowed
        if unknown:
            raise ValueError(f"unknown fault fields {sorted(unknown)}")
        return cls(**data)

    def to_wire(self) -> dict[str, Any]:
        return asdict(self)

    def matches_route(self, route_key: str) -> bool:
        if self.route is None:
            return True
        # "GET /api/jobs/{namespace}" matches exactly; "/api/jobs/{namespace}" matches any method.
        return self.route == route_key or self.route == route_key.split(" ", 1)[1]

    def matches_job(self, job_id: str, labels: dict[str, str]) -> bool:
        if self.job_id is not None and self.job_id != job_id:
            return False
        return all(labels.get(k) == v for k, v in self.labels.items())


class FaultBook:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._faults: list[Fault] = []
        self._ids = itertools.count(1)
        self._release = threading.Event()
        # Requests a `delay` or `hang` is holding right now, by route: tests wait on this state
        # (for example "a job creation is in flight") instead of guessing how long it lasts.
        self._held: dict[str, int] = {}
        self._held_changed = threading.Condition(self._lock)

    def add(self, fault: Fault) -> Fault:
        with self._lock:
            fault.id = next(self._ids)
            self._faults.append(fault)
            self._release.clear()
        return fault

    def clear(self) -> None:
        with self._lock:
            self._faults.clear()
        self.release_hangs()

    def remove(self, fault_id: int) -> bool:
        with self._lock:
            before = len(self._faults)
            self._faults = [f for f in self._faults if f.id != fault_id]
            return len(self._faults) != before

    def active(self) -> list[Fault]:
        with self._lock:
            return list(self._faults)

    def _consume(self, fault: Fault) -> None:
        fault.hits += 1
        if fault.count is not None:
            fault.count -= 1
            if fault.count == 0:
                self._faults.remove(fault)

    def take_request_fault(self, route_key: str) -> Fault | None:
        """The first matching request fault, consumed (one use of its count)."""
        with self._lock:
            for fault in self._faults:
                if fault.kind in REQUEST_FAULTS and fault.matches_route(route_key):
                    self._consume(fault)
                    return fault
        return None

    def take_job_fault(self, kind: str, job_id: str, labels: dict[str, str]) -> Fault | None:
        with self._lock:
            for fault in self._faults:
                if fault.kind == kind and fault.matches_job(job_id, labels):
                    self._consume(fault)
                    return fault
        return None

    def hold(self, route_key: str, fault: Fault) -> None:
        """Hold a request for a `delay` (its seconds) or a `hang` (until released or its maximum)."""
        with self._lock:
            self._held[route_key] = self._held.get(route_key, 0) + 1
            self._held_changed.notify_all()
        try:
            if fault.kind == "delay":
                time.sleep(fault.seconds)
            else:
                self._release.wait(fault.seconds or 300.0)
        finally:
            with self._lock:
                self._held[route_key] -= 1
                self._held_changed.notify_all()

    def wait_held(self, route_key: str, count: int = 1, timeout: float = 60.0) -> None:
        """Until at least `count` requests of `route_key` are being held by a fault."""
        with self._lock:
            if not self._held_changed.wait_for(lambda: self._held.get(route_key, 0) >= count, timeout):
                raise TimeoutError(f"no {count} held request(s) of {route_key} within {timeout}s")

    def release_hangs(self) -> None:
        self._release.set()
