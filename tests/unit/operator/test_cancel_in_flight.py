"""A cancel while a submission request may still be in flight: the job it may yet create must not
be settled at nothing (it would run and bill unseen), so the cancel waits out the window."""

from __future__ import annotations

from datetime import timedelta

import pytest
from posttrain_operator.api import conditions as cond
from posttrain_operator.backends.base import BackendError, RemoteStatus
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.jobs import Retry

from tests.unit.operator.test_reconcilers import NS, World, make_world, started


async def timed_out_submission() -> World:
    world = await started(make_world())
    world.job()
    world.backend.fail_submit = BackendError("read timed out", transient=True)
    with pytest.raises(Retry):
        await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["phase"] == "Admitted"
    return world


async def test_a_cancel_waits_while_a_submission_may_still_create_the_job() -> None:
    world = await timed_out_submission()
    reserved = world.ledger()["reservedMicroUSD"]
    assert reserved > 0
    assert await cancel_agentjob(world.ctx, NS, "j1", cond.EPISODE_ENDED, "the episode ended") is False
    assert world.status("agentjobs", "j1")["phase"] == "Admitted"  # not settled at nothing
    assert world.ledger()["reservedMicroUSD"] == reserved

    # The request arrives after all, and its job runs a minute and a second: the next cancel finds
    # it by its key and settles what it ran.
    world.backend.fail_submit = None
    late = await world.backend.submit(world.backend.requests[-1])
    begun = world.clock()
    world.backend.set_stage(
        late.backend_job_id, RemoteStatus("succeeded", "", begun, begun + timedelta(seconds=61), "COMPLETED")
    )
    world.clock.advance(61)
    assert await cancel_agentjob(world.ctx, NS, "j1", cond.EPISODE_ENDED, "the episode ended") is True
    status = world.status("agentjobs", "j1")
    assert (status["phase"], status["billedSeconds"]) == ("Cancelled", 61)
    assert status["settledMicroUSD"] == 2 * 167 == world.ledger()["settledMicroUSD"]
    assert world.ledger()["reservedMicroUSD"] == 0


async def test_once_the_window_has_closed_a_job_never_created_is_cancelled_at_nothing() -> None:
    world = await timed_out_submission()
    world.clock.advance(world.ctx.settings.submission_window_seconds)
    assert await cancel_agentjob(world.ctx, NS, "j1", cond.EPISODE_ENDED, "the episode ended") is True
    status = world.status("agentjobs", "j1")
    assert (status["phase"], status["settledMicroUSD"]) == ("Cancelled", 0)
    assert world.ledger()["reservedMicroUSD"] == 0
