"""Watch events reach kopf's handlers without `metadata.managedFields`; everything else, bookmarks
included, passes as it came. (That kopf's watcher takes its stream from the wrapped function is
pinned in tests/unit/test_pinned_upstream.py.)"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kopf._cogs.clients import watching
from posttrain_operator import lean_watch

MANAGED = [{"manager": "kopf", "operation": "Update", "fieldsV1": {"f:metadata": {"f:finalizers": {}}}}]


def agentjob_event(kind: str | None = "MODIFIED") -> dict[str, Any]:
    return {
        "type": kind,
        "object": {
            "apiVersion": "posttrain.dev/v1",
            "kind": "AgentJob",
            "metadata": {"name": "j1", "namespace": "ns", "uid": "u1", "resourceVersion": "7",
                         "finalizers": ["posttrain.dev/finalizer"], "managedFields": copy.deepcopy(MANAGED)},
            "spec": {"timeoutSeconds": 60},
            "status": {"phase": "Running"},
        },
    }  # fmt: skip


@pytest.fixture
def upstream(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """kopf's stream replaced by one that yields what the test puts in the list, then the wrapper."""
    sent: list[Any] = []

    async def stream(**kwargs: Any) -> AsyncIterator[Any]:
        for event in sent:
            yield event

    monkeypatch.setattr(watching, "infinite_watch", stream)
    lean_watch.install()
    return sent


async def drain(**kwargs: Any) -> list[Any]:
    return [event async for event in watching.infinite_watch(**kwargs)]


async def test_events_lose_managed_fields_and_keep_everything_else(upstream: list[Any]) -> None:
    listed, modified = agentjob_event(None), agentjob_event("MODIFIED")
    upstream += [listed, watching.Bookmark.LISTED, modified]
    expected = copy.deepcopy(modified)
    del expected["object"]["metadata"]["managedFields"]

    received = await drain(settings=None, resource=None, namespace="ns")

    assert received[1] is watching.Bookmark.LISTED
    assert received[2] == expected
    assert "managedFields" not in received[0]["object"]["metadata"]
    assert received[0]["object"]["metadata"]["finalizers"] == ["posttrain.dev/finalizer"]


async def test_events_without_metadata_or_object_pass_unchanged(upstream: list[Any]) -> None:
    odd = [{"type": "ERROR", "object": {"kind": "Status", "code": 410}}, {"type": "BOOKMARK"},
           {"type": "MODIFIED", "object": {"metadata": None}}]  # fmt: skip
    upstream += copy.deepcopy(odd)
    assert await drain() == odd


async def test_installing_twice_wraps_once(upstream: list[Any]) -> None:
    wrapped = watching.infinite_watch
    lean_watch.install()
    assert watching.infinite_watch is wrapped
    upstream.append(agentjob_event())
    assert "managedFields" not in (await drain())[0]["object"]["metadata"]
