"""The gateway's watch-fed copies (`cache.Store`): newest version wins from any source, deletions are not
undone by older copies, a list replaces what it covers, and waiters wake on changes."""

from __future__ import annotations

import asyncio
from typing import Any

from env_gateway.cache import Store, wait_any, wait_until


def job(name: str, rv: int, phase: str = "Running", episode: str = "ep") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "resourceVersion": str(rv)},
        "spec": {"episode": episode},
        "status": {"phase": phase},
    }


def by_episode(obj: dict[str, Any]) -> str | None:
    episode = obj["spec"].get("episode")
    return episode if isinstance(episode, str) else None


def test_an_older_version_never_replaces_a_newer_one() -> None:
    store = Store()
    store.upsert(job("a", 10, "Succeeded"))  # e.g. a write's answer, ahead of the watch
    held = store.upsert(job("a", 7, "Running"))  # the watch catching up
    assert held["status"]["phase"] == "Succeeded"
    assert store.get("a") == job("a", 10, "Succeeded")
    store.upsert(job("a", 11, "Failed"))
    assert store.get("a") == job("a", 11, "Failed")


def test_a_deleted_object_is_not_brought_back_by_an_older_copy_but_a_new_one_is_kept() -> None:
    store = Store(index_of=by_episode)
    store.upsert(job("a", 5))
    store.delete(job("a", 9))
    assert store.get("a") is None and store.known_gone("a") and store.by_index("ep") == []
    store.upsert(job("a", 8))  # a read answered before the deletion
    assert store.get("a") is None
    store.upsert(job("a", 12, "Pending"))  # made again under the same name
    assert store.get("a") == job("a", 12, "Pending") and not store.known_gone("a")


def test_a_list_replaces_what_it_covers_and_keeps_newer_writes() -> None:
    store = Store(index_of=by_episode)
    store.upsert(job("old", 3))
    store.upsert(job("mine", 30))  # written by the gateway after the list's snapshot
    store.upsert(job("stale", 4, "Running"))
    store.replace([job("stale", 15, "Succeeded"), job("new", 16, episode="other")], "20")
    assert store.get("old") is None and store.known_gone("old")
    assert store.get("mine") == job("mine", 30)
    assert store.get("stale") == job("stale", 15, "Succeeded")
    assert [o["metadata"]["name"] for o in store.by_index("ep")] == ["mine", "stale"]
    assert [o["metadata"]["name"] for o in store.by_index("other")] == ["new"]
    assert store.synced.is_set()


def test_the_index_follows_an_object_that_moves() -> None:
    store = Store(index_of=by_episode)
    store.upsert(job("a", 1, episode="x"))
    store.upsert(job("a", 2, episode="y"))
    assert store.by_index("x") == [] and store.by_index("y") == [job("a", 2, episode="y")]


async def test_a_waiter_wakes_on_the_change_it_waits_for_and_on_deletion() -> None:
    store = Store()
    store.upsert(job("a", 1))
    waiting = asyncio.create_task(wait_until(store, "a", lambda o: o["status"]["phase"] == "Succeeded", 30))
    await asyncio.sleep(0)
    store.upsert(job("a", 2, "Running"))  # a change that does not satisfy it
    await asyncio.sleep(0)
    assert not waiting.done()
    store.upsert(job("a", 3, "Succeeded"))
    assert (await asyncio.wait_for(waiting, 5)) == job("a", 3, "Succeeded")

    gone = asyncio.create_task(wait_until(store, "a", lambda o: False, 30))
    await asyncio.sleep(0)
    store.delete(job("a", 4))
    assert await asyncio.wait_for(gone, 5) is None


async def test_a_waiter_returns_the_object_as_it_is_at_the_timeout() -> None:
    store = Store()
    store.upsert(job("a", 1))
    assert await wait_until(store, "a", lambda o: False, 0.05) == job("a", 1)


async def test_a_wait_on_several_objects_wakes_on_a_change_of_any_of_them() -> None:
    store = Store()
    store.upsert(job("a", 1))
    store.upsert(job("b", 1))

    def b_finished(seen: dict[str, Any]) -> bool:
        return seen["b"] is not None and seen["b"]["status"]["phase"] == "Succeeded"

    waiting = asyncio.create_task(wait_any(store, ["a", "b"], b_finished, 30))
    await asyncio.sleep(0)
    store.upsert(job("a", 2, "Failed"))  # a change that does not satisfy it: it waits on
    await asyncio.sleep(0)
    assert not waiting.done()
    store.upsert(job("b", 3, "Succeeded"))
    seen = await asyncio.wait_for(waiting, 5)
    assert seen == {"a": job("a", 2, "Failed"), "b": job("b", 3, "Succeeded")}
    # At the timeout, the objects as they are; a deleted one as None.
    store.delete(job("a", 4))
    at_timeout = await wait_any(store, ["a", "b"], lambda seen: False, 0.05)
    assert at_timeout == {"a": None, "b": job("b", 3, "Succeeded")}
