"""Durable step counting with group commit.

Every tool call must bump Episode status.steps before it runs, and never past maxSteps. One
compare-and-swap per call would make concurrent callers of one episode fight over the same field, so
callers queue per episode and a single flusher grants a whole batch in one write: steps +
min(waiting, left), refusing the rest. The write is conditional (see `Kube.set_steps`: the count and
the phase as read) and retried on conflict, so the count stays exact beside other writers (other
gateway replicas, kubectl), and no step is counted on an Episode that ended meanwhile.

A step is counted only for a call that runs. A call the platform failed after its step was written
(`give_back`) returns its step with the flusher's next write; a step write whose answer was lost (the
API server went away mid-request) is settled by reading the count back before the next write.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from env_gateway.kube import Conflict, Unavailable

Obj = dict[str, Any]
CAS_ATTEMPTS = 50


class StepLimitReached(Exception):
    def __init__(self, steps: int, max_steps: int) -> None:
        super().__init__(f"step limit reached ({steps} of {max_steps})")
        self.steps = steps
        self.max_steps = max_steps


class CallRefused(Exception):
    """The Episode, as `body` shows it, takes no more calls; `reason` says why."""

    def __init__(self, reason: Exception, body: Obj) -> None:
        super().__init__(str(reason))
        self.reason = reason
        self.body = body


@dataclass(frozen=True)
class _Unsure:
    """A step write that failed after it may have been sent: `after` replaced `before` if it landed,
    counting `granted` steps whose callers were told it failed and paying `paid` given-back steps."""

    before: int
    after: int
    granted: int
    paid: int


@dataclass
class _Queue:
    waiters: list[asyncio.Future[Obj]] = field(default_factory=list)
    flusher: asyncio.Task[None] | None = None
    owed: int = 0  # steps given back, to subtract with the next write
    unsure: _Unsure | None = None

    @property
    def idle(self) -> bool:
        return not self.waiters and not self.owed and self.unsure is None


def _steps(body: Obj) -> int:
    return int((body.get("status") or {}).get("steps", 0))


class StepCounter:
    def __init__(
        self,
        read: Callable[[str, str], Awaitable[Obj | None]],
        write: Callable[[str, str, Obj, int], Awaitable[Obj]],
        max_steps_of: Callable[[Obj], int],
        refusal_of: Callable[[Obj], Exception | None] = lambda _: None,
    ) -> None:
        self._read = read
        self._write = write
        self._max_steps_of = max_steps_of
        self._refusal_of = refusal_of
        self._queues: dict[tuple[str, str], _Queue] = {}

    async def take(self, namespace: str, name: str, current: Obj) -> Obj:
        """Count one step; returns the Episode as written. Raises StepLimitReached when none is left,
        CallRefused when the Episode (as read for the write) takes no calls."""
        key = (namespace, name)
        queue = self._queues.setdefault(key, _Queue())
        future: asyncio.Future[Obj] = asyncio.get_running_loop().create_future()
        queue.waiters.append(future)
        self._start(key, queue, current)
        return await future

    def give_back(self, namespace: str, name: str, current: Obj) -> None:
        """A counted call did not run (the platform failed it): its step comes off with the next write,
        tried at once and again with the next call while the API server is away."""
        key = (namespace, name)
        queue = self._queues.setdefault(key, _Queue())
        queue.owed += 1
        self._start(key, queue, current)

    def _start(self, key: tuple[str, str], queue: _Queue, body: Obj) -> None:
        if queue.flusher is None:
            queue.flusher = asyncio.create_task(self._flush(key, queue, body))

    async def _flush(self, key: tuple[str, str], queue: _Queue, body: Obj) -> None:
        try:
            while queue.waiters or queue.owed:
                batch, queue.waiters = queue.waiters, []
                try:
                    body = await self._grant(key, queue, body, batch)
                except Exception as exc:
                    for future in batch:
                        if not future.done():
                            future.set_exception(exc)
                    if not queue.waiters:
                        return  # what is owed waits for the next call
        finally:
            queue.flusher = None
            if queue.idle:
                self._queues.pop(key, None)

    async def _grant(
        self, key: tuple[str, str], queue: _Queue, body: Obj, batch: list[asyncio.Future[Obj]]
    ) -> Obj:
        batch = [f for f in batch if not f.done()]  # callers that went away take no step
        if queue.unsure is not None:
            body = await self._settle_unsure(key, queue)
        for _ in range(CAS_ATTEMPTS):
            steps, max_steps = _steps(body), self._max_steps_of(body)
            refusal = self._refusal_of(body) if batch else None
            # More owed than counted (the count lowered by hand): the excess can never be paid.
            queue.owed = paid = min(queue.owed, steps)
            granted = 0 if refusal else max(0, min(len(batch), max_steps - steps + paid))
            if granted or paid:
                after = steps + granted - paid
                try:
                    body = await self._write(key[0], key[1], body, after)
                except Conflict:
                    body = await self._fresh(key)
                    continue
                except Unavailable:
                    queue.unsure = _Unsure(steps, after, granted, paid)
                    raise
                queue.owed -= paid
            for i, future in enumerate(batch):
                if future.done():
                    continue
                if i < granted:
                    future.set_result(body)
                elif refusal is not None:
                    future.set_exception(CallRefused(refusal, body))
                else:
                    future.set_exception(StepLimitReached(steps + granted - paid, max_steps))
            return body
        raise Conflict(f"episode {key[0]}/{key[1]}: steps lost {CAS_ATTEMPTS} races in a row")

    async def _settle_unsure(self, key: tuple[str, str], queue: _Queue) -> Obj:
        """Whether the write whose answer was lost landed, from the count as the API server has it
        (one gateway writes an Episode's steps, so the count it wrote is its own)."""
        unsure = queue.unsure
        assert unsure is not None
        body = await self._fresh(key)  # Unavailable: still unsure, settled with the next call
        queue.unsure = None
        if unsure.after != unsure.before and _steps(body) == unsure.after:
            queue.owed += unsure.granted - unsure.paid
        return body

    async def _fresh(self, key: tuple[str, str]) -> Obj:
        fresh = await self._read(*key)
        if fresh is None:
            raise LookupError(f"episode {key[0]}/{key[1]} is gone")
        return fresh
