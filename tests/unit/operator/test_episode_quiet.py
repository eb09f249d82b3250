"""An idle Episode's ticks: a pass that finds nothing to do says until when an unchanged Episode
stays idle (its deadline, or a recheck a minute on), and the ticks in between make no pass."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from posttrain_operator.api.rules import parse_time
from posttrain_operator.handlers import pause
from posttrain_operator.reconcile.episode import IDLE_RECHECK, Quiet, reconcile_episode

from tests.unit.operator.test_reconcilers import NS, make_world, started


async def test_an_idle_running_episode_stays_quiet_until_its_deadline_or_the_recheck() -> None:
    world = await started(make_world())
    observed = world.api.obj("episodes", NS, "ep")
    deadline = parse_time(observed["status"]["deadline"])
    assert deadline is not None
    until = await reconcile_episode(world.ctx, NS, "ep", observed)
    assert until == min(deadline, world.clock() + IDLE_RECHECK)

    world.clock.advance((deadline - world.clock()).total_seconds() - 30)  # half a minute before
    until = await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    assert until == deadline  # the deadline comes before the recheck

    world.clock.advance(30)
    assert await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep")) is None
    assert world.status("episodes", "ep")["outcome"] == "LimitReached"  # the pass at the deadline ended it


async def test_an_episode_with_work_to_do_is_never_quiet() -> None:
    world = await started(make_world())
    world.job()
    observed = world.api.obj("episodes", NS, "ep")
    observed["spec"] = {**observed["spec"], "submission": {"checkpointFrom": "j1"}}
    assert await reconcile_episode(world.ctx, NS, "ep", observed) is None


def test_quiet_holds_only_for_the_same_version_and_before_its_time() -> None:
    world = make_world()
    now = world.clock()
    quiet = Quiet("41", now + timedelta(seconds=60))
    assert quiet.holds("41", now) and quiet.holds("41", now + timedelta(seconds=59))
    assert not quiet.holds("42", now)  # changed: decided again
    assert not quiet.holds("41", now + timedelta(seconds=60))
    assert not Quiet("41", None).holds("41", now) and not Quiet().holds(None, now)


class _Stopper:
    """kopf's `stopped` as the daemon reads it: truthy once set. Set after `after` checks."""

    def __init__(self, after: int) -> None:
        self.checks, self.after = 0, after

    def __bool__(self) -> bool:
        self.checks += 1
        return self.checks > self.after


async def test_a_pause_ends_within_a_step_of_the_stop() -> None:
    stopper = _Stopper(after=2)
    await pause(stopper, 3600, 0.01)  # type: ignore[arg-type]  # an hour, were the stop not seen
    assert stopper.checks == 3


async def test_a_pause_lasts_its_time_when_nothing_stops_it() -> None:
    loop = asyncio.get_running_loop()
    begun = loop.time()
    await pause(_Stopper(after=10**9), 0.05, 0.01)  # type: ignore[arg-type]
    assert loop.time() - begun >= 0.05
