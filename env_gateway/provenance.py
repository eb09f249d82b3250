"""The agent's tool calls, appended to its Episode's provenance (docs/provenance.md).

Every call the step counter counted is recorded once it has its result, before the caller gets it.
Callers of one episode queue, and one flusher writes their calls as one ProvenanceRecord, the next
of the episode's chain (`<episode>-calls-<sequence>`, holding the digest of the one before). A record
is created, never changed: the name is the compare-and-swap. Should another gateway replica have
written that sequence first, the flusher reads the chain's head again and writes the next. The head
is read from the API once per episode and then kept (for the most recent HEADS_KEPT episodes), so a
call costs one create. Calls whose write failed (the API server away) are retried with backoff; their
callers are answered without waiting further.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from posttrain_operator.api import provenance
from posttrain_operator.api.provenance import ProvenanceSpec, ToolCall

Obj = dict[str, Any]
log = logging.getLogger(__name__)
HEAD_RACES = 20
WRITE_ATTEMPTS = 12  # with backoff to 30 s: about five minutes of an API server away
HEADS_KEPT = 4096  # one forgotten costs one list on that episode's next call


@dataclass
class _Chain:
    owner: Obj
    pending: list[tuple[ToolCall, asyncio.Future[None]]] = field(default_factory=list)
    flusher: asyncio.Task[None] | None = None


def tool_call(
    tool: str, arguments: Any, result: str, spent_micro_usd: int, at: str, job: str | None
) -> ToolCall:
    raw = json.dumps(arguments, sort_keys=True, separators=(",", ":"), default=str).encode()
    return ToolCall(
        at=at,
        tool=tool[:64],
        argument_bytes=len(raw),
        arguments_sha256=hashlib.sha256(raw).hexdigest(),
        result=result[:64],
        spent_micro_usd=spent_micro_usd,
        job=job,
    )


class ProvenanceLog:
    def __init__(
        self,
        append: Callable[[str, Obj], Awaitable[bool]],
        list_records: Callable[[str, str], Awaitable[list[Obj]]],
    ) -> None:
        self._append = append
        self._list = list_records
        self._chains: dict[tuple[str, str], _Chain] = {}
        # Per episode, the next sequence and the digest it must follow.
        self._heads: OrderedDict[tuple[str, str], tuple[int, str]] = OrderedDict()

    async def record(self, namespace: str, episode: str, owner: Obj, call: ToolCall) -> None:
        """Append `call`; returns once it is written, or raises what the write raised (the call stays
        queued for the next flush)."""
        key = (namespace, episode)
        chain = self._chains.setdefault(key, _Chain(owner))
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        chain.pending.append((call, future))
        if chain.flusher is None:
            chain.flusher = asyncio.create_task(self._flush(key, chain))
        await asyncio.shield(future)

    async def _flush(self, key: tuple[str, str], chain: _Chain) -> None:
        failures = 0
        try:
            while chain.pending:
                batch = chain.pending[: provenance.MAX_TOOL_CALLS]
                try:
                    await self._write(key, chain.owner, [call for call, _ in batch])
                except Exception as exc:
                    failures += 1
                    for _, future in batch:
                        if not future.done():  # its caller is answered without waiting further
                            future.set_exception(exc)
                            future.exception()  # a caller that went away leaves it unread
                    if failures > WRITE_ATTEMPTS:
                        log.error("episode %s/%s: %d tool calls not recorded: %s", *key, len(batch), exc)
                        del chain.pending[: len(batch)]
                    else:
                        log.warning("episode %s/%s: recording tool calls failed: %s", *key, exc)
                        await asyncio.sleep(min(30.0, 0.5 * 2**failures))
                    continue
                failures = 0
                del chain.pending[: len(batch)]
                for _, future in batch:
                    if not future.done():
                        future.set_result(None)
        finally:
            chain.flusher = None
            if not chain.pending:
                self._chains.pop(key, None)

    async def _write(self, key: tuple[str, str], owner: Obj, calls: list[ToolCall]) -> None:
        namespace, episode = key
        for _ in range(HEAD_RACES):
            head = self._heads.pop(key, None) or await self._head(namespace, episode)
            sequence, previous = head
            spec = ProvenanceSpec(
                format=provenance.FORMAT,
                episode=episode,
                writer="gateway",
                sequence=sequence,
                previous=previous,
                tool_calls=calls,
            )
            name = provenance.calls_record_name(episode, sequence)
            if await self._append(namespace, provenance.record(name, spec, owner)):
                self._heads[key] = (sequence + 1, provenance.digest(spec))
                while len(self._heads) > HEADS_KEPT:
                    self._heads.popitem(last=False)
                return
            # another replica wrote this sequence: the head is read again
        raise RuntimeError(f"episode {namespace}/{episode}: the tool-call chain lost {HEAD_RACES} races")

    async def _head(self, namespace: str, episode: str) -> tuple[int, str]:
        calls = [
            spec
            for spec in provenance.specs_of(await self._list(namespace, episode))
            if spec.writer == "gateway"
        ]
        if not calls:
            return 0, provenance.GENESIS
        last = max(calls, key=lambda spec: spec.sequence)
        return last.sequence + 1, provenance.digest(last)
