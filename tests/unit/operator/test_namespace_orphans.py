"""A new Episode waits while another Episode of its namespace records orphaned jobs, as kopf's index
of the watched Episodes holds them (no list of every Episode per start)."""

from __future__ import annotations

from posttrain_operator.reconcile.episode import reconcile_episode
from posttrain_operator.reconcile.orphan_records import orphans_blocking, orphans_index_entry

from tests.unit.operator.test_reconcilers import NS, make_world


def test_the_index_holds_an_episodes_orphans_and_nothing_for_one_without() -> None:
    # Empty, not None: kopf keeps an object's earlier entries when its handler returns None.
    assert orphans_index_entry(NS, "ep1", {}) == {}
    assert orphans_index_entry(NS, "ep1", {"orphanedJobs": []}) == {}
    listed = {"orphanedJobs": [{"name": "j1", "backendJobId": "b1"}, {"name": "j2"}]}
    assert orphans_index_entry(NS, "ep1", listed) == {NS: ("ep1/j1", "ep1/j2")}


def test_an_episode_is_not_blocked_by_its_own_orphans_or_another_namespaces() -> None:
    index = {NS: [("ep1/j1",), ("ep2/j3", "ep2/j4")], "other": [("ep9/j9",)]}
    assert orphans_blocking(index, NS, "ep1") == ["ep2/j3", "ep2/j4"]
    assert orphans_blocking(index, NS, "ep") == ["ep1/j1", "ep2/j3", "ep2/j4"]
    assert orphans_blocking(index, "third", "ep") == []


async def test_a_new_episode_waits_blocked_until_the_namespaces_orphans_are_gone() -> None:
    world = make_world()
    index: dict[str, list[tuple[str, ...]]] = {NS: [("ended/j1",)]}
    world.ctx.namespace_orphans = index
    world.episode()
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Pending"
    (blocked,) = [c for c in status["conditions"] if c["type"] == "Blocked"]
    assert (blocked["status"], blocked["reason"]) == ("True", "OrphanedJobs")
    assert "ended/j1" in blocked["message"]

    index[NS] = []  # the orphan collected: the index drops the Episode's entry
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Running"
    (blocked,) = [c for c in status["conditions"] if c["type"] == "Blocked"]
    assert blocked["status"] == "False"
