"""Reward integrity in the operator's pure decisions: findings label the reward, a violation withholds
it, dev evaluations are counted and capped in the ledger's write, score jobs screen their lineage."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from posttrain_launcher.spec import MAX_INPUTS, load_spec
from posttrain_operator import ledger as ledger_math
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeStatus, Ledger
from posttrain_operator.api.models import MAX_LINEAGE, AgentJobSpec
from posttrain_operator.api.provenance import script_sha256
from posttrain_operator.backends.base import StagedWheels, launcher_env
from posttrain_operator.jobspec import (
    EVIDENCE_ROOT,
    WHEELS_EVIDENCE_ROOT,
    InvalidJob,
    build_request,
    validate_against_task,
)
from posttrain_operator.reconcile.admission_rules import reserve_in
from posttrain_operator.reconcile.scoring import scoring_outcome

from graders.tasks import get_task

GSM8K = get_task("gsm8k")
ARITHMETIC = get_task("t0_arithmetic_format")


def _finding(verdict: str, check: str = "identity") -> dict[str, Any]:
    return {"check": check, "verdict": verdict, "summary": f"{check} {verdict}", "where": ["checkpoint"]}


def _scored(*findings: dict[str, Any]) -> dict[str, Any]:
    result = {"status": "ok", "score": "0.62", "n": 100, "findings": list(findings)}
    return {"status": {"phase": "Succeeded", "result": result}}


def test_a_score_without_findings_is_labelled_clean() -> None:
    end = scoring_outcome(_scored())
    assert end is not None and (end.outcome, end.reward) == ("Scored", "0.62")
    assert end.integrity is not None and end.integrity.label == "clean" and end.integrity.findings == []


def test_a_recorded_finding_flags_the_reward_and_keeps_it() -> None:
    end = scoring_outcome(_scored(_finding("flagged", "contamination")))
    assert end is not None and (end.outcome, end.reward) == ("Scored", "0.62")
    assert end.integrity is not None and end.integrity.label == "flagged"
    assert "integrity flagged" in end.message


def test_a_violation_withholds_the_reward_as_zero_not_null() -> None:
    end = scoring_outcome(_scored(_finding("flagged", "contamination"), _finding("violation")))
    assert end is not None and (end.outcome, end.reward) == ("IntegrityViolation", "0")
    assert end.integrity is not None and end.integrity.label == "violation"
    assert len(end.integrity.findings) == 2
    # The message names the violation and the grade the agent would have had.
    assert "identity violation" in end.message and "0.62" in end.message
    assert "contamination flagged" not in end.message


def test_an_invalid_checkpoint_is_not_labelled() -> None:
    job = {"status": {"phase": "Succeeded", "result": {"status": "invalid_checkpoint", "reason": "x"}}}
    end = scoring_outcome(job)
    assert end is not None and end.reward == "0" and end.integrity is None


def _running(budget: int = 1_000_000, dev_evaluations: int = 0) -> EpisodeStatus:
    book = ledger_math.with_totals(Ledger(budget_micro_usd=budget))
    return EpisodeStatus(phase="Running", ledger=book, dev_evaluations=dev_evaluations)


def _reserve(status: EpisodeStatus, job: str, amount: int = 100, **dev: Any) -> Any:
    phases = frozenset({"Running"})
    return reserve_in(status, job, amount, platform=False, max_concurrent=5, allowed_phases=phases, **dev)


def test_dev_evaluations_are_counted_in_the_reservation_and_refused_past_the_cap() -> None:
    status = _running()
    for job in ("d1", "d2"):
        status, rejection = _reserve(status, job, dev_evaluation=True, dev_limit=2)
        assert rejection is None and status is not None
    assert status.dev_evaluations == 2
    refused, rejection = _reserve(status, "d3", dev_evaluation=True, dev_limit=2)
    assert refused is None and rejection is not None
    assert rejection.reason == cond.DEV_EVALUATIONS_EXHAUSTED and "allows 2" in rejection.message
    # A train job is neither counted nor capped by it; an uncapped task still counts.
    trained, rejection = _reserve(status, "t1", dev_evaluation=False, dev_limit=2)
    assert rejection is None and trained is not None and trained.dev_evaluations == 2
    uncapped, rejection = _reserve(status, "d3", dev_evaluation=True, dev_limit=None)
    assert rejection is None and uncapped is not None and uncapped.dev_evaluations == 3


def test_a_dev_evaluation_refused_for_budget_or_retried_is_not_counted() -> None:
    status, _ = _reserve(_running(budget=150), "d1", dev_evaluation=True, dev_limit=5)
    assert status is not None and status.dev_evaluations == 1
    assert _reserve(status, "d1", dev_evaluation=True, dev_limit=5) == (None, None)  # a resumed pass
    refused, rejection = _reserve(status, "d2", dev_evaluation=True, dev_limit=5)
    assert refused is None and rejection is not None and rejection.reason == cond.BUDGET_EXCEEDED


def _spec(**fields: Any) -> AgentJobSpec:
    raw = {"episode": "ep", "flavor": "cpu-basic", "timeoutSeconds": 600, **fields}
    return AgentJobSpec.model_validate(raw)


def test_a_score_job_mounts_its_lineage_read_only_and_only_a_score_job_may() -> None:
    spec = _spec(purpose="score", checkpointFrom="final", evidenceFrom=["mid", "first"])
    request = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="ep-score", uid="u1")
    lineage = [m for m in request.inputs_from if m.mount_path.startswith(EVIDENCE_ROOT)]
    assert [(m.prefix, m.read_only) for m in lineage] == [("ns/ep/mid", True), ("ns/ep/first", True)]
    inputs = request.launcher_spec["inputs"]
    assert inputs["lineage_0"] == f"{EVIDENCE_ROOT}/mid" and inputs["lineage_1"] == f"{EVIDENCE_ROOT}/first"
    for purpose, extra in (("train", {"script": "print(1)"}), ("devEval", {"checkpointFrom": "final"})):
        forged = _spec(purpose=purpose, evidenceFrom=["mid"], **extra)
        with pytest.raises(InvalidJob, match="evidenceFrom"):
            validate_against_task(forged, ARITHMETIC, ["cpu-basic"], 3600)


def test_a_score_job_mounts_the_wheels_staged_for_the_jobs_it_screens_and_only_a_score_job_may() -> None:
    wheels = [{"job": "final", "key": "aj-u3"}, {"job": "first", "key": "aj-u1"}]
    spec = _spec(
        purpose="score", checkpointFrom="final", evidenceFrom=["mid", "first"], evidenceWheels=wheels
    )
    validate_against_task(spec, ARITHMETIC, ["cpu-basic"], 3600)
    request = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="ep-score", uid="u4")
    paths = [f"{WHEELS_EVIDENCE_ROOT}/final", f"{WHEELS_EVIDENCE_ROOT}/first"]
    assert request.wheels_from == (StagedWheels("aj-u3", paths[0]), StagedWheels("aj-u1", paths[1]))
    inputs = request.launcher_spec["inputs"]
    assert (inputs["wheels_0"], inputs["wheels_1"]) == tuple(paths)
    assert build_request(spec=_spec(purpose="score", checkpointFrom="final"), task=ARITHMETIC,
                         namespace="ns", job_name="ep-score", uid="u4").wheels_from == ()  # fmt: skip
    # Only the submission and its lineage, and only on a score job.
    stranger = _spec(
        purpose="score", checkpointFrom="final", evidenceWheels=[{"job": "other", "key": "aj-u9"}]
    )
    with pytest.raises(InvalidJob, match="evidenceWheels names only"):
        validate_against_task(stranger, ARITHMETIC, ["cpu-basic"], 3600)
    forged = _spec(purpose="train", script="print(1)", evidenceWheels=wheels[:1])
    with pytest.raises(InvalidJob, match="evidenceWheels"):
        validate_against_task(forged, ARITHMETIC, ["cpu-basic"], 3600)


def test_each_dev_evaluation_of_a_sampling_task_gets_its_own_sample_seed() -> None:
    spec = _spec(purpose="devEval", checkpointFrom="final", flavor="h200")
    scripts = {
        uid: build_request(spec=spec, task=GSM8K, namespace="ns", job_name="d", uid=uid).launcher_spec[
            "script"
        ]
        for uid in ("u1", "u2")
    }
    assert all("--sample-seed" in script for script in scripts.values())
    assert scripts["u1"] != scripts["u2"]
    again = build_request(spec=spec, task=GSM8K, namespace="ns", job_name="d", uid="u1")
    assert again.launcher_spec["script"] == scripts["u1"]  # a resubmission grades the same sample
    # A task that grades all of dev passes no seed; a score job never does.
    arithmetic = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="d", uid="u1")
    assert "--sample-seed" not in arithmetic.launcher_spec["script"]
    score = _spec(purpose="score", checkpointFrom="final", flavor="h200")
    score_script = build_request(spec=score, task=GSM8K, namespace="ns", job_name="s", uid="u1")
    assert "--sample-seed" not in score_script.launcher_spec["script"]


def test_a_score_job_is_told_the_hash_of_every_script_its_submission_was_built_by() -> None:
    shas = [script_sha256(f"print({i})") for i in range(3)]
    spec = _spec(purpose="score", checkpointFrom="final", evidenceFrom=["mid", "first"], evidenceScripts=shas)
    validate_against_task(spec, ARITHMETIC, ["cpu-basic"], 3600)
    script = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="s", uid="u").launcher_spec[
        "script"
    ]
    for job, sha in zip(["final", "mid", "first"], shas, strict=True):
        assert f"'--script', '{job}={sha}'" in script
    # One hash per job, and for score jobs only.
    short = _spec(purpose="score", checkpointFrom="final", evidenceFrom=["mid"], evidenceScripts=shas[:1])
    with pytest.raises(InvalidJob, match="one sha256 for checkpointFrom"):
        validate_against_task(short, ARITHMETIC, ["cpu-basic"], 3600)
    forged = _spec(purpose="train", script="print(1)", evidenceScripts=shas[:1])
    with pytest.raises(InvalidJob, match="evidenceScripts"):
        validate_against_task(forged, ARITHMETIC, ["cpu-basic"], 3600)
    # The hash is of the bytes the launcher writes (UTF-8).
    assert script_sha256("é") == hashlib.sha256("é".encode()).hexdigest()


def test_the_launcher_takes_the_inputs_of_a_score_job_of_the_longest_lineage() -> None:
    lineage = [f"j{i}" for i in range(MAX_LINEAGE)]
    wheels = [{"job": job, "key": f"aj-{job}"} for job in ["final", *lineage]]
    spec = _spec(purpose="score", checkpointFrom="final", evidenceFrom=lineage, evidenceWheels=wheels)
    validate_against_task(spec, ARITHMETIC, ["cpu-basic"], 3600)
    request = build_request(spec=spec, task=ARITHMETIC, namespace="ns", job_name="ep-score", uid="u")
    launched = load_spec(launcher_env(request))
    assert len(launched.inputs) == 3 + MAX_LINEAGE + len(wheels) <= MAX_INPUTS
