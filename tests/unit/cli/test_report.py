"""The episode report, rendered from Episode and AgentJob bodies and read back as a picture: job bars
in their outcome's colour, the spend line, the ledger table."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from posttrain_operator.api import provenance
from posttrain_operator.api.models import AgentJobStatus
from posttrain_operator.api.provenance import ProvenanceSpec

from env_gateway.provenance import tool_call
from posttrain_cli.report import (
    PHASE_COLORS,
    SPEND_COLOR,
    bars,
    episode_report,
    namespace_report,
    spend_curve,
)
from posttrain_cli.views import describe, provenance_lines
from tests.unit.cli.report_pixels import inlined_png, pixels_of

pytestmark = pytest.mark.unit
NOW = datetime(2026, 1, 1, 12, 10, tzinfo=UTC)


def job(
    name: str, purpose: str, phase: str, created: str, finished: str | None, settled: int
) -> dict[str, Any]:
    status: dict[str, Any] = {"phase": phase, "settledMicroUSD": settled}
    if finished:
        status["finishedAt"] = finished
    return {
        "metadata": {"name": name, "namespace": "ns", "creationTimestamp": created},
        "spec": {"episode": "ep", "purpose": purpose},
        "status": status,
    }


EPISODE = {
    "metadata": {"name": "ep", "namespace": "ns", "creationTimestamp": "2026-01-01T12:00:00Z"},
    "spec": {"task": "t0_artifact", "budgetUSD": "0.01", "backend": "hf-jobs"},
    "status": {
        "phase": "Completed",
        "outcome": "Scored",
        "reward": "1",
        "steps": 4,
        "startedAt": "2026-01-01T12:00:00Z",
        "ledger": {
            "budgetMicroUSD": 10_000,
            "settledMicroUSD": 501,
            "reservedMicroUSD": 0,
            "entries": {
                "t1": {"reservedMicroUSD": 1670, "settledMicroUSD": 334},
                "t2": {"reservedMicroUSD": 1670, "settledMicroUSD": 167},
                "s": {"reservedMicroUSD": 0, "settledMicroUSD": 167, "platform": True},
            },
        },
    },
}
JOBS = [
    job("t1", "train", "Succeeded", "2026-01-01T12:00:10Z", "2026-01-01T12:02:00Z", 334),
    job("t2", "train", "Failed", "2026-01-01T12:02:10Z", "2026-01-01T12:03:00Z", 167),
    job("big", "train", "Rejected", "2026-01-01T12:03:10Z", None, 0),
    job("s", "score", "Succeeded", "2026-01-01T12:04:00Z", "2026-01-01T12:05:00Z", 0),
]


def test_spend_curve_steps_up_as_agent_jobs_settle() -> None:
    curve = spend_curve(EPISODE, bars(EPISODE, JOBS, NOW))
    assert curve == [(0.0, 0), (120.0, 0), (120.0, 334), (180.0, 334), (180.0, 501)]


def test_episode_report_shows_job_bars_spend_line_and_ledger() -> None:
    page, png = episode_report(EPISODE, JOBS, [], NOW)
    assert inlined_png(page) == png
    assert pixels_of(png, PHASE_COLORS["Succeeded"]) > 500  # two bars
    assert pixels_of(png, PHASE_COLORS["Failed"]) > 200
    assert pixels_of(png, SPEND_COLOR) > 100
    for text in ("t0_artifact", "Scored", "$0.000334", "platform"):
        assert text in page


def test_namespace_report_places_scored_episodes() -> None:
    other = {**EPISODE, "metadata": {**EPISODE["metadata"], "name": "ep2"}, "status": {"phase": "Running"}}
    page, png = namespace_report("ns", [EPISODE, other], NOW)
    assert "ep2" in page and inlined_png(page) == png
    assert pixels_of(png, "#1f77b4") > 20  # the one scored episode's point


def test_describe_shows_the_rewards_interval_where_the_grader_gave_one() -> None:
    scored = {**EPISODE, "status": {**EPISODE["status"], "rewardInterval": {"low": "0.38", "high": "0.44"}}}
    assert "(95% interval 0.38-0.44)" in describe(scored, JOBS, NOW)
    assert "95% interval" not in describe(EPISODE, JOBS, NOW)


def test_describe_lists_every_ledger_entry_with_its_job() -> None:
    text = describe(EPISODE, JOBS, NOW)
    lines = {line.split()[0]: line.split() for line in text.splitlines()[7:] if line.strip()}
    assert lines["t1"][1:5] == ["train", "Succeeded", "$0.00167", "$0.000334"]
    assert lines["s"][-1] == "platform" or "platform" in lines["s"]
    assert lines["big"][2] == "Rejected" and lines["big"][3] == "-"


def test_describe_and_the_report_show_which_job_read_which_back_to_the_base_model() -> None:
    sft = job("sft", "train", "Succeeded", "2026-01-01T12:00:10Z", "2026-01-01T12:02:00Z", 334)
    dpo = job("dpo", "train", "Succeeded", "2026-01-01T12:02:10Z", "2026-01-01T12:03:00Z", 167)
    dpo["spec"]["inputsFrom"] = ["sft"]
    dpo["status"]["lineage"] = ["sft"]
    episode = {**EPISODE, "spec": {**EPISODE["spec"], "submission": {"checkpointFrom": "dpo"}}}
    text = describe(episode, [sft, dpo], NOW)
    lineage = text.split("Lineage:")[1].strip().splitlines()
    assert lineage[0].split() == ["JOB", "READS", "BUILT", "ON"]
    assert lineage[1].split() == ["dpo", "(submitted)", "sft", "sft", "<-", "base", "model"]
    assert len(lineage) == 2  # sft read nothing and was not submitted
    page, _ = episode_report(episode, [sft, dpo], [], NOW)
    assert "<h2>Lineage</h2>" in page and "sft &lt;- base model" in page
    assert "Lineage:" not in describe(EPISODE, JOBS, NOW)  # nothing read, nothing submitted


def test_describe_lists_the_integrity_findings_and_the_judge_behind_one() -> None:
    findings = [
        {"check": "identity", "verdict": "flagged", "summary": "the base unchanged", "where": ["checkpoint"]},
        {"check": "judge", "verdict": "violation", "summary": "test items in a script", "source": "jf-1"},
    ]
    judged = {
        **EPISODE,
        "status": {**EPISODE["status"], "integrity": {"label": "violation", "findings": findings}},
    }
    text = describe(judged, JOBS, NOW)
    assert "Integrity: violation" in text
    assert "flagged (identity): the base unchanged [in: checkpoint]" in text
    assert "violation (judge jf-1): test items in a script [in: -]" in text
    assert "Integrity:" not in describe(EPISODE, JOBS, NOW)


def _records() -> list[dict[str, Any]]:
    call = tool_call("jobs_submit", {"script": "x"}, "ok", 0, "2026-01-01T12:00:05Z", "t1")
    calls = ProvenanceSpec(format=provenance.FORMAT, episode="ep", writer="gateway", tool_calls=[call])
    entry = provenance.job_entry(
        {"metadata": {"name": "t1"}, "spec": {"episode": "ep", "purpose": "train", "script": "x",
                                              "flavor": "cpu-basic", "timeoutSeconds": 600}},
        AgentJobStatus(phase="Succeeded", billed_seconds=120, finished_at="2026-01-01T12:02:00Z"),
    )  # fmt: skip
    job_spec = ProvenanceSpec(format=provenance.FORMAT, episode="ep", writer="operator", job=entry)
    submission = provenance.SubmissionEntry(
        checkpoint_from="t1", base_model="posttrain/tiny@v1", at="2026-01-01T12:03:30Z"
    )
    sub_spec = ProvenanceSpec(
        format=provenance.FORMAT, episode="ep", writer="operator", submission=submission
    )
    return [{"spec": spec.wire()} for spec in (calls, job_spec, sub_spec)]


def test_describe_and_the_report_show_the_provenance_and_what_it_lacks() -> None:
    records = _records()
    summary = provenance.summarise(provenance.specs_of(records)).wire()
    recorded = {**EPISODE, "status": {**EPISODE["status"], "provenance": summary}}
    text = describe(recorded, JOBS, NOW)
    # 4 steps counted, 1 recorded: the shortfall is shown, not hidden.
    assert "Provenance: 1 tool calls (of 4 counted: 3 unrecorded), 1 jobs (120 s billed)" in text
    assert "submission lineage recorded; tool-call chain intact" in text
    page, _ = episode_report(recorded, JOBS, records, NOW)
    assert "jobs_submit" in page and "job t1" in page and "t1 &lt;- posttrain/tiny@v1" in page
    lines = [json.loads(line) for line in provenance_lines(records)]
    assert [line["writer"] for line in lines] == ["gateway", "operator", "operator"]
    assert all(line["digest"] == provenance.digest(ProvenanceSpec.model_validate(
        {k: v for k, v in line.items() if k != "digest"})) for line in lines)  # fmt: skip
