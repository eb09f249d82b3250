"""Status passes paced by what they cost in backend requests, and deadlines kept between passes
from the local clock (the reconcilers over the in-memory API server, backend and clock)."""

from __future__ import annotations

from posttrain_operator.api import conditions as cond
from posttrain_operator.backends.base import RemoteStatus
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.poller import PassPacer, poll_once

from tests.unit.operator.test_reconcilers import NS, World, make_world, started


async def running_jobs(count: int) -> World:
    world = await started(make_world())
    for i in range(count):
        world.job(f"j{i}")
        await reconcile_agentjob(world.ctx, NS, f"j{i}")
    assert len(world.backend.jobs) == count
    running = RemoteStatus("running", started_at=world.clock(), raw_stage="RUNNING")
    for job_id in world.backend.jobs:
        world.backend.set_stage(job_id, running)
    return world


def pacer_on(world: World, requests_per_minute: float) -> PassPacer:
    return PassPacer(10.0, requests_per_minute, clock=lambda: world.clock().timestamp())


def test_a_pass_is_spaced_by_the_interval_or_by_its_cost_at_the_request_budget() -> None:
    now = [1000.0]
    pacer = PassPacer(interval=10.0, requests_per_minute=120.0, clock=lambda: now[0])
    assert pacer.due("hf-jobs")
    assert pacer.spent("hf-jobs", requests=4, started=now[0]) == 10.0  # cheap: the interval
    assert pacer.spent("hf-jobs", requests=200, started=now[0]) == 100.0  # 10,000 jobs in pages of 50
    now[0] += 99.9
    assert not pacer.due("hf-jobs") and pacer.due("pods")
    now[0] += 0.1
    assert pacer.due("hf-jobs")


async def test_passes_over_many_pages_are_spread_to_stay_within_the_request_budget() -> None:
    world = await running_jobs(2)
    world.backend.page_size = 1  # a pass costs 2 requests: 30 s at 4 a minute
    pacer = pacer_on(world, requests_per_minute=4)
    await poll_once(world.ctx, world.watched(), pacer)
    assert world.backend.stats.calls["status_many"] == 1
    world.clock.advance(29)
    await poll_once(world.ctx, world.watched(), pacer)
    assert world.backend.stats.calls["status_many"] == 1  # not due: the budget says 30 s
    world.clock.advance(1)
    await poll_once(world.ctx, world.watched(), pacer)
    assert world.backend.stats.calls["status_many"] == 2


async def test_a_job_past_its_deadline_is_cancelled_between_passes_from_the_local_clock() -> None:
    world = await running_jobs(2)
    world.backend.page_size = 1
    pacer = pacer_on(world, requests_per_minute=0.1)  # 2 requests: the next pass in 20 minutes
    await poll_once(world.ctx, world.watched(), pacer)
    assert world.status("agentjobs", "j0")["startedAt"]  # what the deadline is counted from
    world.clock.advance(600 + 60)  # the timeout and its grace, not past them
    await poll_once(world.ctx, world.watched(), pacer)
    assert {world.status("agentjobs", j)["phase"] for j in ("j0", "j1")} == {"Running"}

    world.clock.advance(1)
    await poll_once(world.ctx, world.watched(), pacer)
    assert not pacer.due("hf-jobs")  # no pass was due: the clock alone decided
    for name in ("j0", "j1"):
        status = world.status("agentjobs", name)
        assert (status["phase"], status["reason"]) == ("Cancelled", cond.DEADLINE_EXCEEDED)
    assert {job.status.stage for job in world.backend.jobs.values()} == {"cancelled"}
    assert world.ledger()["reservedMicroUSD"] == 0


async def test_a_job_left_unread_by_a_pass_does_not_hold_back_the_others_and_keeps_its_deadline() -> None:
    world = await running_jobs(2)
    pacer = pacer_on(world, requests_per_minute=120)
    await poll_once(world.ctx, world.watched(), pacer)  # every job's start seen
    j0, j1 = (world.status("agentjobs", f"j{n}")["backendJobId"] for n in range(2))
    world.backend.unread = {j0}
    begun = world.clock()  # the jobs' start, as the first pass read it
    world.clock.advance(600 + 60 + 1)  # past the timeout and its grace
    ended = world.clock()
    world.backend.set_stage(j1, RemoteStatus("succeeded", "", ended, ended, "COMPLETED"))
    await poll_once(world.ctx, world.watched(), pacer)
    assert world.status("agentjobs", "j1")["phase"] == "Succeeded"  # read and applied
    # j0 past its deadline from the local clock: cancelled on the backend, but its run times are
    # unread, so it is not settled (at nothing) but kept unconfirmed with its reservation.
    assert world.backend.jobs[j0].status.stage == "cancelled"
    status = world.status("agentjobs", "j0")
    assert (status["phase"], status["reason"]) == ("Orphaned", cond.CANCEL_UNCONFIRMED)
    assert world.ledger()["reservedMicroUSD"] > 0

    world.backend.unread = set()  # readable again: its bill is what it ran
    world.backend.set_stage(j0, RemoteStatus("cancelled", "", begun, ended, "CANCELED"))
    assert await cancel_agentjob(world.ctx, NS, "j0", cond.DEADLINE_EXCEEDED, "overdue") is True
    status = world.status("agentjobs", "j0")
    assert (status["phase"], status["billedSeconds"]) == ("Cancelled", 661)
    assert world.ledger()["reservedMicroUSD"] == 0
