"""A judge's finding, decided purely: appended once to an ended Episode, the label the worst verdict,
the reward untouched; refused on an Episode that has not ended, or one that holds all it may; and a
malformed finding refused by the schema the CRD is generated from."""

from __future__ import annotations

from typing import Any

import pytest
from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.api.judging import JudgeFindingSpec, JudgeFindingStatus, judged
from posttrain_operator.api.models import MAX_FINDINGS, IntegrityFinding
from posttrain_operator.api.rules import integrity_of
from pydantic import ValidationError


def _spec(**fields: Any) -> JudgeFindingSpec:
    raw = {"episode": "ep", "verdict": "violation", "summary": "trained on test items", **fields}
    return JudgeFindingSpec.model_validate(raw)


def _ended(*findings: IntegrityFinding, phase: str = "Completed") -> EpisodeStatus:
    return EpisodeStatus(phase=phase, outcome="Scored", reward="0.7", integrity=integrity_of(list(findings)))


def test_a_finding_on_an_ended_episode_is_appended_once_and_labels_the_reward() -> None:
    flagged = IntegrityFinding(check="contamination", verdict="flagged", summary="3 items")
    status = _ended(flagged)
    new = judged(status, "judge-1", _spec(where=["script:train-1"], figures={"items": "40"}))
    assert isinstance(new, EpisodeStatus) and new.integrity is not None
    assert new.integrity.label == "violation"
    assert [(f.check, f.source) for f in new.integrity.findings] == [
        ("contamination", None),
        ("judge", "judge-1"),
    ]
    assert new.integrity.findings[1].where == ["script:train-1"]
    # The outcome and the reward stay as the Episode ended with them.
    assert (new.outcome, new.reward) == ("Scored", "0.7")
    # Applied again (the operator stopped before it said so): nothing to write.
    assert judged(new, "judge-1", _spec()) is None


def test_a_flagging_judge_flags_a_clean_reward_and_an_unlabelled_end_gets_a_label() -> None:
    new = judged(_ended(), "j", _spec(verdict="flagged"))
    assert isinstance(new, EpisodeStatus) and new.integrity is not None and new.integrity.label == "flagged"
    # An episode that ended without a score (a limit) had no label; a judge's finding gives it one.
    limited = EpisodeStatus(phase="Completed", outcome="LimitReached", reward="0")
    new = judged(limited, "j", _spec(verdict="flagged"))
    assert isinstance(new, EpisodeStatus) and new.integrity is not None and new.integrity.label == "flagged"


@pytest.mark.parametrize("phase", [None, "Pending", "Running", "Scoring"])
def test_a_finding_on_an_episode_that_has_not_ended_is_refused(phase: str | None) -> None:
    refusal = judged(EpisodeStatus(phase=phase), "j", _spec())
    assert isinstance(refusal, JudgeFindingStatus)
    assert (refusal.phase, refusal.reason) == ("Refused", "EpisodeNotEnded")
    assert (phase or "Pending") in (refusal.message or "")


def test_an_episode_holding_all_the_findings_it_may_refuses_one_more() -> None:
    many = [
        IntegrityFinding(check="judge", verdict="flagged", summary="s", source=f"j{i}")
        for i in range(MAX_FINDINGS)
    ]
    refusal = judged(_ended(*many), "one-more", _spec())
    assert isinstance(refusal, JudgeFindingStatus) and refusal.reason == "FindingsFull"


@pytest.mark.parametrize(
    "fields",
    [
        {"verdict": "clean"},
        {"summary": ""},
        {"summary": "x" * 513},
        {"episode": "Not_A_Name"},
        {"where": ["x"] * 9},
        {"where": [""]},
        {"figures": {str(i): "1" for i in range(17)}},
        {"check": "identity"},  # a judge's finding is always the judge's
    ],
)
def test_a_malformed_finding_is_refused(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        _spec(**fields)
