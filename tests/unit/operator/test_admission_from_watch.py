"""Admission from the watched Episode: a new job's pass takes its Episode from the watch instead of
reading it; the ledger's compare-and-swap proves that copy current (or retries from a read), and a
refusal is only ever decided on a read."""

from __future__ import annotations

from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.episode import reconcile_episode

from tests.unit.operator.test_reconcilers import NS, World, make_world, started


def watch(world: World, episode: dict[str, Any]) -> None:
    """The Episode as the operator's watch delivered it."""
    world.ctx.watched_episodes[(NS, episode["metadata"]["name"])] = episode


async def admit(world: World, job: str = "j1") -> dict[str, Any]:
    await reconcile_agentjob(world.ctx, NS, job, observed=world.api.obj("agentjobs", NS, job))
    return world.status("agentjobs", job)


async def test_a_current_copy_saves_the_episode_read() -> None:
    world = await started(make_world())
    watch(world, world.api.obj("episodes", NS, "ep"))
    world.job()
    world.api.reset_calls()

    assert (await admit(world))["phase"] == "Running"
    assert list(world.ledger()["entries"]) == ["j1"]
    # The job and the namespace's BudgetQuota (none here) are read; its Episode is not: the ledger
    # write is the first call about it.
    assert world.api.calls["get_namespaced_custom_object"] == 2
    assert world.api.calls["replace_namespaced_custom_object_status"] == 1
    owners = world.api.obj("agentjobs", NS, "j1")["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [("Episode", "ep")]


async def test_a_stale_copy_costs_a_retry_from_a_read_and_loses_no_update() -> None:
    world = await started(make_world())
    watch(world, world.api.obj("episodes", NS, "ep"))
    # Another writer (the gateway counting a step) changed the Episode after the watch delivered it.
    await world.api.patch_namespaced_custom_object_status(
        "", "", NS, "episodes", "ep", {"status": {"steps": 7}}
    )
    world.job()
    world.api.reset_calls()

    assert (await admit(world))["phase"] == "Running"
    episode = world.status("episodes", "ep")
    assert episode["steps"] == 7 and list(episode["ledger"]["entries"]) == ["j1"]
    assert world.api.calls["replace_namespaced_custom_object_status"] == 2


async def test_a_copy_from_before_the_episode_started_refuses_nothing() -> None:
    world = make_world()
    world.episode()
    watch(world, world.api.obj("episodes", NS, "ep"))  # not started yet, as the watch last saw it
    await reconcile_episode(world.ctx, NS, "ep")
    assert world.status("episodes", "ep")["phase"] == "Running"
    world.job()

    assert (await admit(world))["phase"] == "Running"


async def test_a_copy_that_shows_no_room_left_refuses_nothing_the_episode_has_room_for() -> None:
    world = await started(make_world(), limits={"maxConcurrentJobs": 1})
    world.job("j1")
    assert (await admit(world, "j1"))["phase"] == "Running"
    watch(world, world.api.obj("episodes", NS, "ep"))  # j1 running: no room for another job
    # j1's reservation is settled since (it finished), which the watch has not delivered yet.
    ledger = world.ledger()
    ledger["entries"]["j1"]["settledMicroUSD"] = 0
    await world.api.patch_namespaced_custom_object_status(
        "", "", NS, "episodes", "ep", {"status": {"ledger": {**ledger, "reservedMicroUSD": 0}}}
    )
    world.job("j2")

    assert (await admit(world, "j2"))["phase"] == "Running"


async def test_a_refusal_stands_when_the_read_confirms_it() -> None:
    world = await started(make_world(), limits={"maxConcurrentJobs": 1})
    world.job("j1")
    assert (await admit(world, "j1"))["phase"] == "Running"
    watch(world, world.api.obj("episodes", NS, "ep"))
    world.job("j2")

    status = await admit(world, "j2")
    assert status["phase"] == "Rejected" and status["reason"] == cond.TOO_MANY_JOBS
    assert list(world.ledger()["entries"]) == ["j1"]
