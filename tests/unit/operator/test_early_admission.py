"""Admission from the creation event, ahead of kopf (`admit_created`): the finalizer claimed while
the reservation is made, and every way the job can change under it: kopf first, a deletion, a pass
already done. Over the in-memory API server of the reconciler tier."""

from __future__ import annotations

from typing import Any

import pytest
from posttrain_operator.reconcile.admission import admit_created, reconcile_agentjob
from posttrain_operator.reconcile.early_admission import unclaimed

from tests.unit.operator.test_reconcilers import CPU_BASIC, NS, World, make_world, started

FINALIZER = "posttrain.dev/finalizer"


@pytest.fixture
def world() -> World:
    return make_world()


def created(world: World, name: str = "j1") -> dict[str, Any]:
    """The job as its creation event shows it."""
    world.job(name)
    return world.api.obj("agentjobs", NS, name)


async def test_a_created_job_is_claimed_reserved_and_submitted_in_one_pass(world: World) -> None:
    await started(world)
    event = created(world)
    assert unclaimed(event, FINALIZER)
    world.api.reset_calls()
    await admit_created(world.ctx, event)

    job = world.api.obj("agentjobs", NS, "j1")
    assert job["metadata"]["finalizers"] == [FINALIZER]
    assert job["status"]["phase"] == "Running" and world.backend.stats.calls["submit"] == 1
    assert world.ledger()["entries"] == {"j1": {"reservedMicroUSD": CPU_BASIC * 10, "platform": False}}
    # The claim (not a read of the job), the Episode read, the ledger, the adoption, two status writes.
    assert world.api.calls == {
        "get_namespaced_custom_object": 1,
        "patch_namespaced_custom_object": 2,
        "replace_namespaced_custom_object_status": 1,
        "patch_namespaced_custom_object_status": 2,
    }
    assert not unclaimed(job, FINALIZER)

    # kopf's own pass, afterwards, finds the job Running and does nothing.
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1", observed=event)
    assert world.backend.stats.calls["submit"] == 1 and world.api.writes() == 0


async def test_when_kopf_added_the_finalizer_first_the_claim_reads_again_and_goes_on(world: World) -> None:
    await started(world)
    event = created(world)
    world.api.objects[("agentjobs", NS, "j1")]["metadata"]["finalizers"] = [FINALIZER]
    world.api.objects[("agentjobs", NS, "j1")]["metadata"]["resourceVersion"] = "kopf"
    await admit_created(world.ctx, event)
    job = world.api.obj("agentjobs", NS, "j1")
    assert job["metadata"]["finalizers"] == [FINALIZER]  # not added twice
    assert job["status"]["phase"] == "Running" and world.backend.stats.calls["submit"] == 1


async def test_a_change_by_another_writer_is_kept(world: World) -> None:
    await started(world)
    event = created(world)
    stored = world.api.objects[("agentjobs", NS, "j1")]["metadata"]
    stored["finalizers"], stored["resourceVersion"] = ["example.com/keep"], "other"
    await admit_created(world.ctx, event)
    assert world.api.obj("agentjobs", NS, "j1")["metadata"]["finalizers"] == ["example.com/keep", FINALIZER]


async def test_a_job_deleted_before_the_claim_has_its_reservation_released(world: World) -> None:
    await started(world)
    event = created(world)
    del world.api.objects[("agentjobs", NS, "j1")]
    await admit_created(world.ctx, event)
    assert world.backend.stats.calls.get("submit", 0) == 0
    assert world.ledger()["entries"] == {
        "j1": {"reservedMicroUSD": CPU_BASIC * 10, "settledMicroUSD": 0, "platform": False}
    }
    assert world.ledger()["reservedMicroUSD"] == 0 and world.ledger()["settledMicroUSD"] == 0


async def test_a_job_being_deleted_gets_no_finalizer_and_no_reservation_left(world: World) -> None:
    await started(world)
    event = created(world)
    stored = world.api.objects[("agentjobs", NS, "j1")]["metadata"]
    stored["finalizers"], stored["deletionTimestamp"] = ["example.com/keep"], "2026-01-01T00:00:00Z"
    await admit_created(world.ctx, event)
    assert world.api.obj("agentjobs", NS, "j1")["metadata"]["finalizers"] == ["example.com/keep"]
    assert world.backend.stats.calls.get("submit", 0) == 0
    assert world.ledger()["reservedMicroUSD"] == 0


async def test_a_job_another_pass_already_submitted_is_left_alone(world: World) -> None:
    """kopf's pass ran first: the early one finds the reservation made and the job Running."""
    await started(world)
    event = created(world)
    await reconcile_agentjob(world.ctx, NS, "j1")
    ledger = world.ledger()
    world.api.reset_calls()
    await admit_created(world.ctx, event)
    assert world.backend.stats.calls["submit"] == 1
    assert world.ledger() == ledger
    assert "patch_namespaced_custom_object_status" not in world.api.calls


async def test_a_pass_already_done_keeps_its_reservation_when_the_job_is_then_deleted(world: World) -> None:
    """The job went after another pass submitted it: its reservation is that pass's (settled when
    the cancellation is confirmed), never released at nothing by this one."""
    await started(world)
    event = created(world)
    await reconcile_agentjob(world.ctx, NS, "j1")
    del world.api.objects[("agentjobs", NS, "j1")]
    await admit_created(world.ctx, event)
    assert world.ledger()["entries"]["j1"] == {"reservedMicroUSD": CPU_BASIC * 10, "platform": False}


async def test_a_refused_job_is_rejected_and_claimed(world: World) -> None:
    await started(world, limits={"maxConcurrentJobs": 1})
    await admit_created(world.ctx, created(world, "j1"))
    await admit_created(world.ctx, created(world, "j2"))
    job = world.api.obj("agentjobs", NS, "j2")
    assert job["status"]["phase"] == "Rejected" and job["metadata"]["finalizers"] == [FINALIZER]
    assert set(world.ledger()["entries"]) == {"j1"}
