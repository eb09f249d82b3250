"""An Episode's flavors within its namespace's BudgetQuota: fixed when it starts (its own or its task's,
narrowed to the quota's), refused outright when none is left, and what its jobs and graders may use."""

from __future__ import annotations

from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import API_VERSION
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.episode import reconcile_episode

from tests.unit.operator.test_reconcilers import NS, World, make_world


def with_quota(**spec: Any) -> World:
    world = make_world()
    body = {"limitUSD": "100", **spec}
    world.api.put(
        "budgetquotas",
        NS,
        {"apiVersion": API_VERSION, "kind": "BudgetQuota", "metadata": {"name": "default"}, "spec": body},
    )
    return world


async def test_a_task_s_default_flavors_are_narrowed_to_the_quota_s_at_start() -> None:
    world = with_quota(flavors=["cpu-upgrade", "t4-small"])
    world.episode()  # no flavors of its own: the task's are cpu-basic, cpu-upgrade
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Running" and status["flavors"] == ["cpu-upgrade"]

    world.job("j1", flavor="cpu-basic")
    world.job("j2", flavor="cpu-upgrade")
    await reconcile_agentjob(world.ctx, NS, "j1")
    await reconcile_agentjob(world.ctx, NS, "j2")
    refused = world.status("agentjobs", "j1")
    assert refused["phase"] == "Rejected" and refused["reason"] == cond.NOT_IN_QUOTA
    assert refused["message"].endswith("the namespace's BudgetQuota allows this episode: cpu-upgrade")
    assert world.status("agentjobs", "j2")["phase"] == "Running"
    assert list(world.ledger()["entries"]) == ["j2"]  # the refused job reserved nothing


async def test_without_a_quota_or_with_one_listing_no_flavors_nothing_is_fixed() -> None:
    for world in (make_world(), with_quota()):
        world.episode()
        await reconcile_episode(world.ctx, NS, "ep")
        status = world.status("episodes", "ep")
        assert status["phase"] == "Running" and "flavors" not in status


async def test_an_episode_none_of_whose_flavors_the_quota_allows_fails_at_start() -> None:
    world = with_quota(flavors=["a100-large"])
    world.episode(flavors=["cpu-basic"])
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Failed" and status["ledger"]["budgetMicroUSD"] == 0  # never started
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == cond.NOT_IN_QUOTA
    assert ready["message"] == (
        "none of the flavors cpu-basic is among those the namespace's BudgetQuota allows: a100-large"
    )


async def test_a_quota_the_operator_cannot_apply_fails_the_episode_with_its_reason() -> None:
    world = with_quota(limitUSD="-5")  # the API server refuses this; a stale or forced copy may not
    world.episode()
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Failed" and "flavors" not in status
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == cond.QUOTA_INVALID and "BudgetQuota cannot be applied" in ready["message"]
