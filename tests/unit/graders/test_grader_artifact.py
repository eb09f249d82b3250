import json
import os
from pathlib import Path

import pytest

from graders.artifact import ANSWER_FILE, grade
from graders.assets.datasets import write_dataset_repo
from graders.inputs import GraderInputs
from graders.tasks import get_task

TASK = get_task("t0_artifact")
CHECKS = [{"key": "k00", "expected": 7}, {"key": "k01", "expected": -3}]


@pytest.fixture
def inputs(tmp_path: Path) -> GraderInputs:
    write_dataset_repo(tmp_path / "split", CHECKS)
    (tmp_path / "outputs").mkdir()
    return GraderInputs(checkpoint=tmp_path / "outputs", split=tmp_path / "split", base_model=None)


def write_answer(inputs: GraderInputs, answer: object) -> None:
    (inputs.checkpoint / ANSWER_FILE).write_text(json.dumps(answer))


def test_right_answer_scores_one(inputs: GraderInputs) -> None:
    write_answer(inputs, {"k00": 7, "k01": -3})
    result = grade(TASK, inputs)
    assert (result.status, result.score, result.n) == ("ok", 1.0, 2)


def test_wrong_answer_scores_zero(inputs: GraderInputs) -> None:
    write_answer(inputs, {"k00": 7, "k01": 3})
    result = grade(TASK, inputs)
    assert (result.status, result.score, result.details) == ("ok", 0.0, {"matched_keys": 1})


@pytest.mark.parametrize(
    ("content", "want_reason"),
    [
        pytest.param(None, "no answer.json", id="missing"),
        pytest.param(b"{not json", "not valid JSON", id="not-json"),
        pytest.param(b"\xff\xfe", "not valid JSON", id="not-utf8"),
    ],
)
def test_unreadable_artifact_is_invalid(
    inputs: GraderInputs, content: bytes | None, want_reason: str
) -> None:
    if content is not None:
        (inputs.checkpoint / ANSWER_FILE).write_bytes(content)
    result = grade(TASK, inputs)
    assert (result.status, result.score) == ("invalid_checkpoint", 0.0)
    assert want_reason in (result.reason or "")


def test_symlinked_artifact_is_invalid(inputs: GraderInputs, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere.json"
    elsewhere.write_text(json.dumps({"k00": 7, "k01": -3}))
    os.symlink(elsewhere, inputs.checkpoint / ANSWER_FILE)
    result = grade(TASK, inputs)
    assert (result.status, result.score) == ("invalid_checkpoint", 0.0)
