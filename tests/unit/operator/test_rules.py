"""The Episode rules the operator and the gateway share: limits in force, budget left, running jobs,
time left, token hashes and times."""

from __future__ import annotations

import hashlib
from datetime import UTC, datetime, timedelta, timezone

import pytest
from posttrain_operator.api import rules
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus, Ledger, LedgerEntry

from graders.tasks import get_task

TASK = get_task("t0_artifact")
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def spec(**fields: object) -> EpisodeSpec:
    base = {"task": "t0_artifact", "budgetUSD": "0.05", "backend": "hf-jobs"}
    return EpisodeSpec.model_validate({**base, **fields})


def test_each_limit_comes_from_the_spec_else_from_the_task() -> None:
    limits = rules.limits_in_force(spec(limits={"maxSteps": 7, "maxJobTimeoutSeconds": 120}), TASK)
    assert limits == rules.Limits(
        max_steps=7,
        max_wall_seconds=TASK.limits.max_wall_seconds,
        max_concurrent_jobs=TASK.limits.max_concurrent_jobs,
        max_job_timeout_seconds=120,
    )


def test_flavors_come_from_the_spec_else_from_the_task() -> None:
    assert rules.allowed_flavors(spec(), TASK) == TASK.default_flavors
    assert rules.allowed_flavors(spec(flavors=["cpu-upgrade"]), TASK) == ["cpu-upgrade"]


def test_running_jobs_are_unsettled_agent_entries_only() -> None:
    ledger = Ledger(
        entries={
            "a": LedgerEntry(reserved_micro_usd=10),
            "b": LedgerEntry(reserved_micro_usd=10, settled_micro_usd=3),
            "score": LedgerEntry(platform=True),
        }
    )
    assert rules.jobs_running(ledger) == 1


def test_remaining_budget_uses_the_spec_until_the_operator_sets_the_ledger() -> None:
    assert rules.remaining_micro_usd(spec(), Ledger()) == 50_000
    started = Ledger(budget_micro_usd=40_000, reserved_micro_usd=5_000, settled_micro_usd=1_000)
    assert rules.remaining_micro_usd(spec(), started) == 34_000


def test_steps_and_seconds_left() -> None:
    limits = rules.limits_in_force(spec(limits={"maxSteps": 3}), TASK)
    assert rules.steps_left(EpisodeStatus(steps=2), limits) == 1
    assert rules.steps_left(EpisodeStatus(steps=5), limits) == 0
    assert rules.seconds_left(EpisodeStatus(), NOW) is None
    deadline = rules.format_time(NOW + timedelta(seconds=30))
    assert rules.seconds_left(EpisodeStatus(deadline=deadline), NOW - timedelta(milliseconds=1)) == 31
    assert rules.seconds_left(EpisodeStatus(deadline=deadline), NOW + timedelta(hours=1)) == 0


@pytest.mark.parametrize(
    ("phase", "want"), [("Completed", True), ("Failed", True), ("Scoring", False), (None, False)]
)
def test_an_episode_has_ended_once_completed_or_failed(phase: str | None, want: bool) -> None:
    assert rules.has_ended(EpisodeStatus.model_validate({"phase": phase})) is want


def test_the_stored_token_hash_prefers_the_operators_copy() -> None:
    token = "s3cret"
    digest = hashlib.sha256(token.encode()).hexdigest()
    assert rules.token_hash(token) == digest
    other = "0" * 64
    both = {"spec": {"agentTokenHash": other}, "status": {"agentTokenHash": digest}}
    assert rules.stored_token_hash(both) == digest
    assert rules.stored_token_hash({"spec": {"agentTokenHash": other}, "status": {}}) == other
    assert rules.stored_token_hash({"spec": {}, "status": None}) is None


def test_times_round_trip_in_utc() -> None:
    local = datetime(2026, 11, 29, 13, 0, 5, 900_000, tzinfo=timezone(timedelta(hours=1)))
    assert rules.format_time(local) == "2026-11-29T12:00:05Z"
    assert rules.parse_time("2026-11-29T12:00:05Z") == datetime(2026, 11, 29, 12, 0, 5, tzinfo=UTC)
    assert rules.parse_time("") is None and rules.parse_time(None) is None
