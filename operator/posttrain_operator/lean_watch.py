"""kopf's watch events without `metadata.managedFields`.

An AgentJob carries one managedFields entry per writer (its creator, kopf, the operator's spec and
status writes): 68 of the 78 dicts of a watched body, half its bytes. kopf holds every event in flight
(queued per object, then as the Body and Patch of the handler run), so in a burst of admissions or a
drain these entries were most of the operator's memory. Nothing in the operator reads them, and kopf
strips them from its own diff base, so each event drops them as it arrives. A write sent without
managedFields leaves the server's record as it is (only an explicit empty list resets it).

kopf's watcher looks up `watching.infinite_watch` on each (re)connection, so replacing the module's
function before the watchers start covers every event, the initial listing's included (checked
against kopf 1.45.2: tests/unit/test_pinned_upstream.py fails if that changes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kopf._cogs.clients import watching


def drop_managed_fields(event: object) -> None:
    """In place: the event's object loses `metadata.managedFields` (bookmarks pass as they are)."""
    obj = event.get("object") if isinstance(event, dict) else None
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)


def install() -> None:
    """Idempotent: kopf's watch stream, wrapped once."""
    upstream = watching.infinite_watch
    if getattr(upstream, "lean", False):
        return

    async def lean_infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        async for event in upstream(**kwargs):
            drop_managed_fields(event)
            yield event

    lean_infinite_watch.lean = True  # type: ignore[attr-defined]
    watching.infinite_watch = lean_infinite_watch
