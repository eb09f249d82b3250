"""An orphan stays on its Episode's list until its job's terminal status is written: whatever stops
the operator between the settle and that write (a kill, the API server going away), or between that
write and the unlisting, the orphan collector finishes it. Before, the settle unlisted it, and a job
whose terminal write failed stayed Orphaned with nothing left to look at it (the chaos soak, seed 1)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator.api import conditions as cond
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.orphans import collect_orphans

from tests.unit.operator.test_reconcilers import NS, World, make_world, started


@pytest.fixture
def world() -> World:
    return make_world()


async def orphaned(world: World) -> None:
    """j1 running, then a cancel the backend does not confirm: Orphaned, listed, its first retry due."""
    await started(world)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    world.backend.confirm_cancel = False
    assert not await cancel_agentjob(world.ctx, NS, "j1", cond.EPISODE_ENDED, "test")
    world.backend.confirm_cancel = True
    world.clock.advance(5)


def listed(world: World) -> list[str]:
    return [orphan["name"] for orphan in world.status("episodes", "ep")["orphanedJobs"]]


async def test_a_settled_orphan_whose_job_write_failed_is_finished_next_time(world: World) -> None:
    await orphaned(world)
    world.api.conflicts["patch_namespaced_custom_object_status"] = 1  # the job's terminal write fails
    with pytest.raises(ApiException):
        await collect_orphans(world.ctx, NS, "ep")
    assert world.ledger()["reservedMicroUSD"] == 0, "the settle went through"
    settled = world.ledger()["settledMicroUSD"]
    assert world.status("agentjobs", "j1")["phase"] == "Orphaned"
    assert listed(world) == ["j1"], "unlisted before its job was finished: no one would finish it"

    await collect_orphans(world.ctx, NS, "ep")
    assert world.status("agentjobs", "j1")["phase"] == "Cancelled"
    assert listed(world) == []
    assert world.ledger()["settledMicroUSD"] == settled, "settled once"
    conditions = world.status("episodes", "ep")["conditions"]
    assert next(c for c in conditions if c["type"] == cond.ORPHANED)["status"] == "False"


async def test_a_finished_orphan_still_listed_is_unlisted_by_the_next_collection(world: World) -> None:
    await orphaned(world)
    # As if the operator stopped between the job's terminal write and the unlisting.
    job = world.api.objects[("agentjobs", NS, "j1")]
    job["status"] = {**job["status"], "phase": "Cancelled", "reason": cond.EPISODE_ENDED}
    cancels = world.backend.stats.calls["cancel"]

    await collect_orphans(world.ctx, NS, "ep")
    assert listed(world) == []
    assert world.backend.stats.calls["cancel"] == cancels, "a finished job needs no cancel"


async def test_finishing_an_orphan_unlists_it_at_once(world: World) -> None:
    await orphaned(world)
    await collect_orphans(world.ctx, NS, "ep")
    assert world.status("agentjobs", "j1")["phase"] == "Cancelled"
    assert listed(world) == []
    assert world.ledger()["reservedMicroUSD"] == 0
