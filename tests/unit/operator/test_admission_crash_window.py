"""A job refused by the pass that resumes its admission releases what an earlier pass reserved for it.
The earlier pass wrote the ledger and stopped before the job's Admitted write (the operator killed, the
API server gone); meanwhile the Episode ended, or the namespace's quota changed, and the job is
refused. Before, it was Rejected with its reservation held, and an ended Episode kept it reserved for
good: cancelling its jobs skips the finished ones (the chaos soak, seed 1)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator.api import conditions as cond
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.episode import reconcile_episode

from tests.unit.operator.test_quota_flavors import with_quota
from tests.unit.operator.test_reconcilers import CPU_BASIC, NS, World, make_world, started

RESERVED = CPU_BASIC * 10  # ten minutes of timeout


async def reserved_then_stopped(world: World) -> None:
    """j1's ledger entry written, its Admitted write failed: as a pass the operator died in."""
    world.job()
    world.api.conflicts["patch_namespaced_custom_object_status"] = 1
    with pytest.raises(ApiException):
        await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.ledger()["entries"] == {"j1": {"reservedMicroUSD": RESERVED, "platform": False}}
    assert "phase" not in world.status("agentjobs", "j1")


def on_quota(world: World) -> list[str]:
    """The jobs holding a reservation on the namespace's BudgetQuota ("job episode window amount")."""
    status = world.status("budgetquotas", "default")
    return [reservation.split()[0] for reservation in status.get("reservations") or []]


def end(world: World) -> None:
    world.api.objects[("episodes", NS, "ep")]["status"]["phase"] = "Completed"


async def test_a_job_refused_after_its_episode_ended_releases_its_reservation() -> None:
    world = await started(make_world())
    await reserved_then_stopped(world)
    end(world)

    await reconcile_agentjob(world.ctx, NS, "j1")
    status = world.status("agentjobs", "j1")
    assert status["phase"] == "Rejected" and status["reason"] == cond.EPISODE_NOT_RUNNING
    assert world.ledger()["reservedMicroUSD"] == 0
    assert world.ledger()["entries"]["j1"]["settledMicroUSD"] == 0, "never ran: charged nothing"
    assert world.ledger()["settledMicroUSD"] == 0


async def test_a_release_whose_rejection_was_not_written_is_done_again_harmlessly() -> None:
    world = await started(make_world())
    await reserved_then_stopped(world)
    end(world)
    world.api.conflicts["patch_namespaced_custom_object_status"] = 1  # the Rejected write fails
    with pytest.raises(ApiException):
        await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.ledger()["reservedMicroUSD"] == 0, "released before the job is marked"
    once = world.ledger()

    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["phase"] == "Rejected"
    assert world.ledger() == once
    assert world.api.calls["replace_namespaced_custom_object_status"] == 0, "nothing left to release"


async def test_a_job_the_quota_refuses_on_resuming_releases_both_reservations_seen_stale_or_not() -> None:
    world = with_quota(flavors=["cpu-basic", "cpu-upgrade"])
    await started(world)
    stale = world.api.obj("episodes", NS, "ep")  # as the watch delivered it before the reservation
    await reserved_then_stopped(world)
    assert on_quota(world) == ["j1"]
    # The platform narrows the namespace's flavors.
    world.api.objects[("budgetquotas", NS, "default")]["spec"]["flavors"] = ["cpu-upgrade"]

    world.ctx.watched_episodes[(NS, "ep")] = stale
    await reconcile_agentjob(world.ctx, NS, "j1", observed=world.api.obj("agentjobs", NS, "j1"))
    assert world.status("agentjobs", "j1")["reason"] == cond.NOT_IN_QUOTA
    assert world.ledger()["reservedMicroUSD"] == 0
    assert on_quota(world) == []


async def test_a_job_refused_without_an_earlier_reservation_writes_no_ledger() -> None:
    world = await started(make_world())
    end(world)
    world.job()
    world.api.reset_calls()

    await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["reason"] == cond.EPISODE_NOT_RUNNING
    assert world.api.calls["replace_namespaced_custom_object_status"] == 0
    assert world.ledger()["entries"] == {}


async def test_an_ended_episode_releases_a_reservation_left_by_a_job_rejected_holding_it() -> None:
    """As an operator before the release left it: j1 Rejected, its entry unsettled, the Episode ended.
    The entry would hold the Episode short of releasing its backend and sealing its provenance."""
    world = await started(make_world())
    await reserved_then_stopped(world)
    end(world)
    job = world.api.objects[("agentjobs", NS, "j1")]
    job["status"] = {"phase": "Rejected", "reason": cond.EPISODE_NOT_RUNNING}

    await reconcile_episode(world.ctx, NS, "ep")
    assert world.ledger()["reservedMicroUSD"] == 0
    assert world.ledger()["entries"]["j1"]["settledMicroUSD"] == 0
    assert world.status("agentjobs", "j1")["phase"] == "Rejected"
