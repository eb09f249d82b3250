"""Durable step counting with group commit.

Every tool call must bump Episode status.steps before it runs, and never past maxSteps. One
compare-and-swap per call would make concurrent callers of one episode fight over the same field, so
callers queue per episode and a single flusher grants a whole batch in one write: steps +
min(waiting, left), refusing the rest. The write is conditional (see `Kube.set_steps`) and retried on
conflict, so the count stays exact beside other writers (other gateway replicas, kubectl).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from env_gateway.kube import Conflict

Obj = dict[str, Any]
CAS_ATTEMPTS = 50


class StepLimitReached(Exception):
    def __init__(self, steps: int, max_steps: int) -> None:
        super().__init__(f"step limit reached ({steps} of {max_steps})")
        self.steps = steps
        self.max_steps = max_steps


@dataclass
class _Queue:
    waiters: list[asyncio.Future[Obj]] = field(default_factory=list)
    flusher: asyncio.Task[None] | None = None


class StepCounter:
    def __init__(
        self,
        read: Callable[[str, str], Awaitable[Obj | None]],
        write: Callable[[str, str, Obj, int], Awaitable[Obj]],
        max_steps_of: Callable[[Obj], int],
    ) -> None:
        self._read = read
        self._write = write
        self._max_steps_of = max_steps_of
        self._queues: dict[tuple[str, str], _Queue] = {}

    async def take(self, namespace: str, name: str, current: Obj) -> Obj:
        """Count one step; returns the Episode as written. Raises StepLimitReached when none is left."""
        key = (namespace, name)
        queue = self._queues.setdefault(key, _Queue())
        future: asyncio.Future[Obj] = asyncio.get_running_loop().create_future()
        queue.waiters.append(future)
        if queue.flusher is None:
            queue.flusher = asyncio.create_task(self._flush(key, queue, current))
        return await future

    async def _flush(self, key: tuple[str, str], queue: _Queue, body: Obj) -> None:
        try:
            while queue.waiters:
                batch, queue.waiters = queue.waiters, []
                try:
                    body = await self._grant(key, body, batch)
                except Exception as exc:
                    for future in batch:
                        if not future.done():
                            future.set_exception(exc)
        finally:
            queue.flusher = None
            if not queue.waiters:
                self._queues.pop(key, None)

    async def _grant(self, key: tuple[str, str], body: Obj, batch: list[asyncio.Future[Obj]]) -> Obj:
        batch = [f for f in batch if not f.done()]  # callers that went away take no step
        for _ in range(CAS_ATTEMPTS):
            steps = int((body.get("status") or {}).get("steps", 0))
            max_steps = self._max_steps_of(body)
            granted = max(0, min(len(batch), max_steps - steps))
            if granted:
                try:
                    body = await self._write(key[0], key[1], body, steps + granted)
                except Conflict:
                    fresh = await self._read(*key)
                    if fresh is None:
                        raise LookupError(f"episode {key[0]}/{key[1]} is gone") from None
                    body = fresh
                    continue
            for i, future in enumerate(batch):
                if future.done():
                    continue
                if i < granted:
                    future.set_result(body)
                else:
                    future.set_exception(StepLimitReached(steps + granted, max_steps))
            return body
        raise Conflict(f"episode {key[0]}/{key[1]}: steps lost {CAS_ATTEMPTS} races in a row")
