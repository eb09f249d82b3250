"""Misconfigurations end in a visible state in one pass: a backend the operator does not run fails the
Episode (and refuses its jobs), a refused token rejects the job with that reason, an unreachable
backend leaves the job Pending with a condition said once, and terminal states carry the conditions
`kubectl wait` waits on."""

from __future__ import annotations

from typing import Any

import pytest
from posttrain_operator.api import conditions as cond
from posttrain_operator.backends.base import (
    BACKEND_UNREACHABLE,
    CREDENTIALS_MISSING,
    CREDENTIALS_REJECTED,
    BackendError,
    Health,
)
from posttrain_operator.config import OperatorSettings
from posttrain_operator.handlers import MAX_RETRY_DELAY, backoff
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.episode import reconcile_episode
from posttrain_operator.reconcile.jobs import Retry
from posttrain_operator.runtime import build_backends

from tests.unit.operator.test_reconcilers import NS, World, make_world, started


@pytest.fixture
def world() -> World:
    """The reconcilers' world, with the Events they emit kept as (kind, reason)."""
    made = make_world()
    events: list[tuple[str, str]] = []
    made.ctx.emit = lambda body, _type, reason, _message: events.append((body["kind"], reason))
    made.events = events  # type: ignore[attr-defined]
    return made


def _reasons(world: World, kind: str) -> list[str]:
    return [reason for k, reason in world.events if k == kind]  # type: ignore[attr-defined]


def _conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status.get("conditions", [])}


async def test_an_episode_on_a_backend_not_enabled_fails_at_once_with_a_reason(world: World) -> None:
    world.episode(backend="pods")
    await reconcile_episode(world.ctx, NS, "ep")

    status = world.status("episodes", "ep")
    assert status["phase"] == "Failed"
    assert "'pods' is not enabled" in status["message"] and "hf-jobs" in status["message"]
    assert _conditions(status)[cond.ENDED] == ("True", "BackendNotEnabled")
    assert _reasons(world, "Episode") == ["BackendNotEnabled"]
    await reconcile_episode(world.ctx, NS, "ep")  # a second pass changes nothing and says nothing
    assert _reasons(world, "Episode") == ["BackendNotEnabled"]


async def test_a_job_on_a_backend_not_enabled_is_rejected(world: World) -> None:
    await started(world)
    del world.ctx.backends["hf-jobs"]  # the operator restarted without it
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")

    status = world.status("agentjobs", "j1")
    assert status["phase"] == "Rejected" and status["reason"] == "BackendNotEnabled"
    assert _conditions(status)[cond.FINISHED] == ("True", "BackendNotEnabled")


async def test_a_running_episode_whose_backend_went_away_still_ends_at_its_deadline(world: World) -> None:
    await started(world, limits={"maxWallSeconds": 60})
    del world.ctx.backends["hf-jobs"]
    world.clock.advance(61)
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Completed" and status["outcome"] == "LimitReached"
    assert _conditions(status)[cond.ENDED] == ("True", "LimitReached")


async def test_a_refused_token_rejects_the_job_and_marks_the_backend_unhealthy(world: World) -> None:
    await started(world)
    world.backend.fail_price = BackendError("401 Unauthorized", transient=False, reason=CREDENTIALS_REJECTED)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")

    status = world.status("agentjobs", "j1")
    assert status["phase"] == "Rejected" and status["reason"] == CREDENTIALS_REJECTED
    assert "401" in status["message"]
    assert world.ctx.health["hf-jobs"].reason == CREDENTIALS_REJECTED
    assert world.ledger()["entries"] == {}


async def test_an_unreachable_backend_leaves_the_job_pending_with_a_condition_said_once(world: World) -> None:
    await started(world)
    world.backend.fail_price = BackendError("connection refused", transient=True)
    world.job()
    for _ in range(3):
        with pytest.raises(Retry):
            await reconcile_agentjob(world.ctx, NS, "j1")

    status = world.status("agentjobs", "j1")
    assert status["phase"] == "Pending" and status["reason"] == BACKEND_UNREACHABLE
    assert _conditions(status)[cond.ADMITTED] == ("False", BACKEND_UNREACHABLE)
    assert _reasons(world, "AgentJob") == [BACKEND_UNREACHABLE]
    world.backend.fail_price = None
    await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["phase"] == "Running"


async def test_an_episode_starting_on_a_refusing_backend_says_so(world: World) -> None:
    world.ctx.health["hf-jobs"] = Health(CREDENTIALS_REJECTED, "whoami: 401 Invalid user token.")
    await started(world)
    status = world.status("episodes", "ep")
    assert _conditions(status)[cond.BACKEND_READY] == ("False", CREDENTIALS_REJECTED)
    assert CREDENTIALS_REJECTED in _reasons(world, "Episode")


async def test_terminal_job_states_carry_the_finished_condition(world: World) -> None:
    await started(world)
    world.job(flavor="a100-large")  # not offered: rejected
    await reconcile_agentjob(world.ctx, NS, "j1")
    assert _conditions(world.status("agentjobs", "j1"))[cond.FINISHED] == ("True", cond.INVALID_JOB)


def test_retries_back_off_to_a_cap() -> None:
    delays = [backoff(5, attempt) for attempt in range(12)]
    assert delays[:4] == [5, 10, 20, 40]
    assert delays == sorted(delays) and delays[-1] == MAX_RETRY_DELAY


@pytest.mark.parametrize("token", [None, "", "  \n"], ids=["no-secret", "empty-key", "blank-key"])
async def test_hf_jobs_enabled_without_a_token_reports_its_secret_and_refuses_calls(
    token: str | None,
) -> None:
    env: dict[str, Any] = {"hf_jobs_enabled": True, "hf_namespace": "acme",
                           "hf_token_source": "Secret posttrain-system/hf-token, key token"}  # fmt: skip
    if token is not None:
        env["hf_token"] = token
    backends = build_backends(OperatorSettings(**env))
    health = await backends["hf-jobs"].check()  # type: ignore[attr-defined]
    assert health.reason == CREDENTIALS_MISSING and "hf-token, key token" in health.message
    with pytest.raises(BackendError) as refused:
        await backends["hf-jobs"].price("cpu-basic")
    assert refused.value.reason == CREDENTIALS_MISSING and not refused.value.transient


def test_hf_jobs_stays_off_without_the_flag_or_a_token() -> None:
    assert build_backends(OperatorSettings()) == {}
