"""An idle Episode's ticks: a pass that finds nothing to do says until when an unchanged Episode
stays idle (its deadline, or a recheck a minute on), and its daemon makes no pass until then unless
the Episode changes."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import timedelta
from typing import Any

import pytest
from posttrain_operator import handlers
from posttrain_operator.api.rules import parse_time
from posttrain_operator.handlers import EpisodeChanges, _tick_until_stopped, wait_for_change
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


async def test_a_quiet_daemon_passes_again_as_soon_as_its_episode_changes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    world = await started(make_world())
    key = (NS, "ep")
    body = world.api.obj("episodes", NS, "ep")
    changes = EpisodeChanges()
    passes: asyncio.Queue[str] = asyncio.Queue()

    async def counted(*args: Any, **kwargs: Any) -> Any:
        passes.put_nowait(body["metadata"]["resourceVersion"])
        return await reconcile_episode(*args, **kwargs)

    monkeypatch.setattr(handlers, "reconcile_episode", counted)
    stopped: Any = False  # kopf's `stopped` as the daemon reads it; kopf stops a daemon by cancelling it
    daemon = asyncio.create_task(_tick_until_stopped(world.ctx, key, body, changes.watch(key), stopped))
    try:
        first = await asyncio.wait_for(passes.get(), 30)
        changes.changed(("other", "ep"))  # another Episode's event wakes nothing here
        await asyncio.sleep(0.05)
        assert passes.empty()  # quiet: no pass until a change (or the recheck, a minute on)

        body["metadata"] = {**body["metadata"], "resourceVersion": f"{first}-changed"}  # kopf swaps the body,
        changes.changed(key)  # then runs its event handler
        # Far below the minute a missed wake-up would take.
        assert await asyncio.wait_for(passes.get(), 30) == f"{first}-changed"
    finally:
        daemon.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await daemon


async def test_a_wait_for_change_ends_when_the_flag_is_set() -> None:
    changed = asyncio.Event()
    waiting = asyncio.create_task(wait_for_change(changed, 3600))
    await asyncio.sleep(0)
    assert not waiting.done()
    changed.set()
    await asyncio.wait_for(waiting, 30)  # an hour, were the flag not seen


async def test_a_wait_for_change_lasts_its_time_when_nothing_changes() -> None:
    loop = asyncio.get_running_loop()
    begun = loop.time()
    await wait_for_change(asyncio.Event(), 0.05)
    assert loop.time() - begun >= 0.05
    await wait_for_change(asyncio.Event(), -1)  # a time already past: at once


def test_changes_are_flagged_only_for_watched_episodes() -> None:
    changes = EpisodeChanges()
    changes.changed((NS, "ep"))  # not watched: nothing to wake, and no flag left behind
    flag = changes.watch((NS, "ep"))
    assert not flag.is_set()
    changes.changed((NS, "ep"))
    assert flag.is_set()
    changes.forget((NS, "ep"))
    assert not changes.watch((NS, "ep")).is_set()  # a new daemon starts with a new flag
