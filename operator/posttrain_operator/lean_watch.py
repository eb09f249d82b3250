"""kopf's watch events without `metadata.managedFields` (see `k8s.drop_managed_fields`).

An AgentJob carries one managedFields entry per writer (its creator, kopf, the operator's spec and
status writes), half a watched body's bytes. kopf holds every event in flight (queued per object, then
as the Body and Patch of the handler run), in a burst of admissions or a drain thousands at once.
Nothing in kopf reads them (kopf 1.45.2 never names the field), so each event drops them as it
arrives.

kopf's watcher looks up `watching.infinite_watch` when it starts, and that stream lists, watches and
reconnects for it; replacing the module's function before the watchers start covers every event, the
initial listing's included (checked against kopf 1.45.2: tests/unit/test_pinned_upstream.py fails if
that changes)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from kopf._cogs.clients import watching

from posttrain_operator.k8s import drop_managed_fields


def install() -> None:
    """Idempotent: kopf's watch stream, wrapped once."""
    upstream = watching.infinite_watch
    if getattr(upstream, "lean", False):
        return

    async def lean_infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        async for event in upstream(**kwargs):
            if isinstance(event, dict):  # not one of kopf's bookmarks
                drop_managed_fields(event.get("object"))
            yield event

    lean_infinite_watch.lean = True  # type: ignore[attr-defined]
    watching.infinite_watch = lean_infinite_watch
