"""The reconcilers' pure decisions: admission, limits, scoring outcomes, job requests, conditions."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus, Ledger, OrphanedJob
from posttrain_operator.api.models import AgentJobSpec
from posttrain_operator.jobspec import InvalidJob, build_request, validate_against_task
from posttrain_operator.reconcile.admission_rules import Rejection, decide_admission, reserve_in
from posttrain_operator.reconcile.ending import vanished_jobs
from posttrain_operator.reconcile.episode import limit_reached
from posttrain_operator.reconcile.finishing import format_score
from posttrain_operator.reconcile.scoring import scoring_outcome

from graders.tasks import get_task

NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)
ARTIFACT = get_task("t0_artifact")
ARITHMETIC = get_task("t0_arithmetic_format")


def _job(name: str = "j1", **spec: Any) -> tuple[dict[str, Any], AgentJobSpec]:
    raw = {
        "episode": "ep",
        "purpose": "train",
        "script": "print(1)",
        "flavor": "cpu-basic",
        "timeoutSeconds": 600,
    }
    raw.update(spec)
    return {"metadata": {"name": name}, "spec": raw}, AgentJobSpec.model_validate(raw)


def _episode(phase: str | None = "Running", **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "ep"},
        "spec": {"task": "t0_artifact", "budgetUSD": "1.00", "backend": "hf-jobs"},
        "status": {"phase": phase, **status},
    }


def test_admission_refuses_a_missing_episode() -> None:
    job, spec = _job()
    decided = decide_admission(job, spec, None)
    assert isinstance(decided, Rejection) and decided.reason == cond.EPISODE_NOT_FOUND


@pytest.mark.parametrize("phase", ["Pending", "Scoring", "Completed", None])
def test_admission_refuses_train_jobs_outside_running(phase: str | None) -> None:
    job, spec = _job()
    decided = decide_admission(job, spec, _episode(phase))
    assert isinstance(decided, Rejection) and decided.reason == cond.EPISODE_NOT_RUNNING


def test_admission_refuses_a_score_job_the_operator_did_not_create() -> None:
    job, spec = _job("sneaky", purpose="score", script="", checkpointFrom="j0")
    decided = decide_admission(job, spec, _episode("Scoring", scoringJob="ep-score"))
    assert decided == Rejection(cond.INVALID_JOB, "score jobs are created only by the operator")


def test_admission_accepts_the_operators_score_job_while_scoring() -> None:
    job, spec = _job("ep-score", purpose="score", script="", checkpointFrom="j0")
    decided = decide_admission(job, spec, _episode("Scoring", scoringJob="ep-score"))
    assert not isinstance(decided, Rejection)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"flavor": "a100-large"}, "flavor 'a100-large' is not allowed"),
        ({"timeoutSeconds": 86400}, "exceeds the episode's limit"),
        ({"datasets": ["hidden"]}, "not allowed for task t0_artifact"),
        ({"script": "  "}, "a train job needs a script"),
        ({"purpose": "devEval", "script": ""}, "needs checkpointFrom"),
        ({"purpose": "devEval", "checkpointFrom": "j0"}, "script and packages must be empty"),
    ],
    ids=["flavor", "timeout", "dataset", "no-script", "deveval-no-checkpoint", "deveval-with-script"],
)
def test_job_must_fit_its_task(change: dict[str, Any], message: str) -> None:
    _, spec = _job(**change)
    with pytest.raises(InvalidJob, match=message):
        validate_against_task(
            spec, ARTIFACT, ARTIFACT.default_flavors, ARTIFACT.limits.max_job_timeout_seconds
        )


def _running(budget: int, **entries: int) -> EpisodeStatus:
    book = ledger_math.with_totals(Ledger(budget_micro_usd=budget))
    for name, amount in entries.items():
        book = ledger_math.reserve(book, name, amount).ledger
    return EpisodeStatus(phase="Running", ledger=book)


def test_reserve_in_enforces_concurrency_and_budget_atomically() -> None:
    status = _running(10_000, a=100, b=100)
    new, rejection = reserve_in(
        status, "c", 100, platform=False, max_concurrent=2, allowed_phases={"Running"}
    )
    assert new is None and rejection is not None and rejection.reason == cond.TOO_MANY_JOBS
    new, rejection = reserve_in(
        status, "c", 20_000, platform=False, max_concurrent=5, allowed_phases={"Running"}
    )
    assert new is None and rejection is not None and rejection.reason == cond.BUDGET_EXCEEDED
    new, rejection = reserve_in(
        status, "c", 100, platform=False, max_concurrent=5, allowed_phases={"Running"}
    )
    assert rejection is None and new is not None and new.ledger.reserved_micro_usd == 300


def test_reserve_in_is_a_no_op_for_a_job_already_reserved() -> None:
    status = _running(10_000, a=100)
    assert reserve_in(status, "a", 100, platform=False, max_concurrent=1, allowed_phases={"Running"}) == (
        None,
        None,
    )


def test_only_an_ended_episode_judges_its_unlisted_unsettled_jobs_vanished() -> None:
    running = _running(10_000, gone=100, listed=100, orphan=100, done=100)
    running.ledger = ledger_math.settle(running.ledger, "done", 50).ledger
    running.orphaned_jobs = [OrphanedJob(name="orphan", backend_job_id="job-9")]
    listed = {"listed", "done"}
    # Running (or Scoring): a job may yet be admitted, and a missing one is not judged at all.
    assert vanished_jobs(running, listed) == []
    assert vanished_jobs(running.model_copy(update={"phase": "Scoring"}), listed) == []
    for phase in ("Completed", "Failed"):
        ended = running.model_copy(update={"phase": phase})
        # Not the listed job, not the settled one, not the orphan (its collection has its backend id).
        assert vanished_jobs(ended, listed) == ["gone"]
        assert vanished_jobs(ended, {*listed, "gone"}) == []


def _spec(**limits: int) -> EpisodeSpec:
    return EpisodeSpec.model_validate(
        {"task": "t0_artifact", "budgetUSD": "1.00", "backend": "hf-jobs", "limits": limits}
    )


def test_limits_end_the_episode_with_reward_zero() -> None:
    status = _running(1_000_000).model_copy(
        update={"steps": 5, "deadline": (NOW + timedelta(hours=1)).isoformat()}
    )
    assert limit_reached(_spec(maxSteps=10), status, ARTIFACT, NOW, 167) is None
    by_steps = limit_reached(_spec(maxSteps=5), status, ARTIFACT, NOW, 167)
    assert by_steps is not None and (by_steps.outcome, by_steps.reward) == ("LimitReached", "0")
    late = limit_reached(_spec(maxSteps=10), status, ARTIFACT, NOW + timedelta(hours=2), 167)
    assert late is not None and "wall-time" in late.message


def test_budget_exhaustion_waits_for_running_jobs() -> None:
    nearly_spent = _running(300, a=200)
    assert limit_reached(_spec(), nearly_spent, ARTIFACT, NOW, 167) is None  # a job still runs
    settled = nearly_spent.model_copy(
        update={"ledger": ledger_math.settle(nearly_spent.ledger, "a", 200).ledger}
    )
    end = limit_reached(_spec(), settled, ARTIFACT, NOW, 167)
    assert end is not None and "budget exhausted" in end.message


def _score_job(phase: str, result: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"status": {"phase": phase, **({"result": result} if result else {})}}


@pytest.mark.parametrize(
    ("job", "outcome", "reward"),
    [
        (_score_job("Running"), None, None),
        (_score_job("Succeeded", {"status": "ok", "score": "0.95", "n": 200}), "Scored", "0.95"),
        (
            _score_job("Succeeded", {"status": "invalid_checkpoint", "score": "0", "reason": "extra key"}),
            "Scored",
            "0",
        ),
        (_score_job("Succeeded", {"status": "error", "reason": "no result.json"}), "GraderFailed", None),
        (_score_job("Failed"), "GraderFailed", None),
    ],
    ids=["running", "scored", "invalid-checkpoint-is-zero", "grader-error-is-null", "job-failed-is-null"],
)
def test_scoring_outcome(job: dict[str, Any], outcome: str | None, reward: str | None) -> None:
    end = scoring_outcome(job)
    if outcome is None:
        assert end is None
    else:
        assert end is not None and (end.outcome, end.reward) == (outcome, reward)


def test_a_score_with_an_interval_carries_it_into_the_end() -> None:
    result = {"status": "ok", "score": "0.41", "n": 1319, "interval": {"low": "0.385", "high": "0.437"}}
    end = scoring_outcome(_score_job("Succeeded", result))
    assert end is not None and end.reward == "0.41"
    assert end.reward_interval is not None and (end.reward_interval.low, end.reward_interval.high) == (
        "0.385",
        "0.437",
    )
    assert "95% interval [0.385, 0.437]" in end.message
    plain = scoring_outcome(_score_job("Succeeded", {"status": "ok", "score": "0.5", "n": 2}))
    assert plain is not None and plain.reward_interval is None


def test_train_jobs_never_see_any_grading_split() -> None:
    _, spec = _job(datasets=[])
    request = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="j1", uid="u1")
    mounted = {r.repo_id for r in request.repos}
    assert ARITHMETIC.hidden_split.repo_id not in mounted
    assert request.launcher_spec["role"] == "agent"
    assert set(request.launcher_spec["inputs"]) == {"model", *ARITHMETIC.agent_datasets}
    assert request.outputs is not None and request.outputs.prefix == "ns/ep/j1"
    assert request.key == "aj-u1"


@pytest.mark.parametrize(("purpose", "split"), [("devEval", "dev_split"), ("score", "hidden_split")])
def test_grader_jobs_mount_one_split_and_the_checkpoint_read_only(purpose: str, split: str) -> None:
    _, spec = _job(purpose=purpose, script="", checkpointFrom="j0")
    request = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="g1", uid="u2")
    repos = {r.mount_path: r.repo_id for r in request.repos}
    assert repos["/inputs/split"] == getattr(ARITHMETIC, split).repo_id
    other = "hidden_split" if split == "dev_split" else "dev_split"
    assert getattr(ARITHMETIC, other).repo_id not in repos.values()
    (checkpoint,) = request.inputs_from
    assert checkpoint.prefix == "ns/ep/j0" and checkpoint.read_only
    assert request.launcher_spec["role"] == "grader" and request.launcher_spec["packages"] == []
    assert f"'--purpose', '{purpose}'" in request.launcher_spec["script"]  # the grader knows why it runs


@pytest.mark.parametrize(
    ("purpose", "agent_env", "grader_env", "want"),
    [
        ("train", "trl", None, "img/trl:1"),
        ("devEval", "trl", None, None),  # graders keep the launcher's image unless the task says
        ("score", "trl", "eval", "img/eval:1"),
        ("train", None, "eval", None),
    ],
)
def test_each_job_runs_in_the_environment_its_task_names_for_its_kind(
    purpose: str, agent_env: str | None, grader_env: str | None, want: str | None
) -> None:
    task = ARITHMETIC.model_copy(update={"agent_environment": agent_env, "grader_environment": grader_env})
    extra = {"script": "", "checkpointFrom": "j0"} if purpose != "train" else {}
    _, spec = _job(purpose=purpose, **extra)
    images = {"trl": "img/trl:1", "eval": "img/eval:1"}
    request = build_request(spec=spec, task=task, namespace="ns", job_name="j", uid="u",
                            environment_images=images)  # fmt: skip
    assert request.image == want


def test_conditions_move_transition_time_only_on_a_flip() -> None:
    first, changed = cond.set_condition([], "Ready", True, "Started", "go", "t1", 1)
    assert changed and first[0].last_transition_time == "t1"
    same, changed = cond.set_condition(first, "Ready", True, "Started", "go", "t2", 1)
    assert not changed and same[0].last_transition_time == "t1"
    reworded, _ = cond.set_condition(first, "Ready", True, "Still", "going", "t3", 2)
    assert reworded[0].last_transition_time == "t1" and reworded[0].observed_generation == 2
    flipped, _ = cond.set_condition(first, "Ready", False, "Ended", "stop", "t4", 2)
    assert flipped[0].last_transition_time == "t4" and flipped[0].status == "False"


def test_a_condition_holds_only_while_its_status_is_true() -> None:
    """What the gateway asks of a new Episode: is it Blocked (orphaned jobs in its namespace)?"""
    blocked, _ = cond.set_condition([], cond.BLOCKED, True, cond.ORPHANED_JOBS, "two jobs", "t1", 1)
    ready, _ = cond.set_condition(blocked, cond.READY, True, "Started", "go", "t1", 1)
    found = cond.holding(ready, cond.BLOCKED)
    assert found is not None and found.message == "two jobs"
    cleared, _ = cond.set_condition(ready, cond.BLOCKED, False, cond.ORPHANED_JOBS, "none", "t2", 1)
    assert cond.holding(cleared, cond.BLOCKED) is None
    assert cond.holding(cleared, cond.READY) is not None


@pytest.mark.parametrize(("score", "text"), [(1.0, "1"), (0.0, "0"), (0.955, "0.955"), (0.1 + 0.2, "0.3")])
def test_scores_become_exact_decimal_strings(score: float, text: str) -> None:
    assert format_score(score) == text
