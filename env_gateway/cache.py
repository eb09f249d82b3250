"""Watch-fed copies of the gateway namespace's Episodes and AgentJobs, so a tool call reads them without
a round trip to the API server (`kube_mirror.Mirror` keeps a `Store` filled; nothing here calls the API).

A store never goes backwards. Objects arrive from the watch and also from the gateway's own reads and
writes (a write's answer is newer than anything the watch has delivered yet); each object replaces the
stored one only if its resourceVersion is newer, and a deletion leaves a tombstone that older copies
cannot resurrect. So whatever one caller was shown, a later read shows the same or newer.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

Obj = dict[str, Any]


def resource_version(obj: Obj) -> int:
    """The object's resourceVersion as a number: the API server's (etcd's) revision, which orders
    every write of one resource; -1 for none (never newer than anything)."""
    try:
        return int(obj["metadata"]["resourceVersion"])
    except (KeyError, TypeError, ValueError):
        return -1


class Store:
    """One resource's objects in one namespace by name, with an optional secondary index (e.g. the
    AgentJobs of an episode), and a change signal per name for callers that wait on an object."""

    def __init__(self, index_of: Callable[[Obj], str | None] | None = None) -> None:
        self._objects: dict[str, Obj] = {}
        self._gone: dict[str, int] = {}  # name -> resourceVersion of its deletion
        self._index_of = index_of
        self._index: dict[str, set[str]] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self.synced = asyncio.Event()  # set by the first complete list, never cleared

    # --- reads ---------------------------------------------------------------------------------

    def get(self, name: str) -> Obj | None:
        return self._objects.get(name)

    def known_gone(self, name: str) -> bool:
        """The store saw `name` deleted (so a miss is an answer, not a reason to ask the API server)."""
        return name in self._gone and name not in self._objects

    def by_index(self, key: str) -> list[Obj]:
        return [self._objects[n] for n in sorted(self._index.get(key, ()))]

    def values(self) -> list[Obj]:
        return list(self._objects.values())

    def changed(self, name: str) -> asyncio.Event:
        """An event set at the next change of `name` (an update, or its deletion). Take it before
        checking the object, then wait on it: a change in between is not missed."""
        event = self._changed.get(name)
        if event is None:
            event = self._changed[name] = asyncio.Event()
        return event

    # --- writes (from the watch, and from the gateway's own reads and writes) -------------------

    def upsert(self, obj: Obj) -> Obj:
        """Keep `obj` if it is newer than what the store holds; returns what the store now holds."""
        name = obj["metadata"]["name"]
        rv = resource_version(obj)
        held = self._objects.get(name)
        if held is not None and resource_version(held) >= rv:
            return held
        if name in self._gone:
            if self._gone[name] >= rv:
                return obj  # an older copy of a deleted object: not brought back
            del self._gone[name]
        self._unindex(held)
        self._objects[name] = obj
        self._reindex(obj)
        self._notify(name)
        return obj

    def delete(self, obj: Obj) -> None:
        name = obj["metadata"]["name"]
        rv = resource_version(obj)
        held = self._objects.get(name)
        if held is not None and resource_version(held) > rv:
            return  # deleted, then made again (a newer object of the same name)
        self._unindex(self._objects.pop(name, None))
        self._gone[name] = max(rv, self._gone.get(name, -1))
        self._notify(name)

    def replace(self, items: Iterable[Obj], list_version: str) -> None:
        """A complete list at `list_version`: it is the truth up to that version. Objects the gateway
        stored from its own writes after it stay; everything else not listed is gone."""
        at = int(list_version) if list_version.isdigit() else -1
        listed = {o["metadata"]["name"]: o for o in items}
        self._gone = {n: v for n, v in self._gone.items() if v > at}
        for name, held in list(self._objects.items()):
            if name not in listed and resource_version(held) <= at:
                self.delete({"metadata": {"name": name, "resourceVersion": str(max(at, 0))}})
        for obj in listed.values():
            self.upsert(obj)
        self.synced.set()

    def _notify(self, name: str) -> None:
        event = self._changed.pop(name, None)
        if event is not None:
            event.set()

    def _unindex(self, obj: Obj | None) -> None:
        key = self._index_of(obj) if obj is not None and self._index_of else None
        if obj is not None and key is not None:
            names = self._index.get(key, set())
            names.discard(obj["metadata"]["name"])
            if not names:
                self._index.pop(key, None)

    def _reindex(self, obj: Obj) -> None:
        key = self._index_of(obj) if self._index_of else None
        if key is not None:
            self._index.setdefault(key, set()).add(obj["metadata"]["name"])


async def wait_until(store: Store, name: str, done: Callable[[Obj], bool], seconds: float) -> Obj | None:
    """The stored `name` once `done(obj)` holds, else as it is at the timeout; None once deleted.
    Woken by the store's changes, never by polling."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        event = store.changed(name)
        obj = store.get(name)
        if obj is None or done(obj):
            return obj
        left = deadline - loop.time()
        if left <= 0:
            return obj
        try:
            async with asyncio.timeout(left):
                await event.wait()
        except TimeoutError:
            return store.get(name)


async def wait_any(
    store: Store, names: list[str], done: Callable[[dict[str, Obj | None]], bool], seconds: float
) -> dict[str, Obj | None]:
    """The stored objects of `names` (None: deleted or unknown) once `done` holds of them, else as
    they are at the timeout. Woken by a change of any of them, never by polling."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while True:
        events = [store.changed(name) for name in names]
        seen = {name: store.get(name) for name in names}
        left = deadline - loop.time()
        if done(seen) or left <= 0:
            return seen
        waits = [asyncio.ensure_future(event.wait()) for event in events]
        try:
            await asyncio.wait(waits, timeout=left, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiting in waits:
                waiting.cancel()
