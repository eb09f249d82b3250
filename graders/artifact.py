"""Grader of `t0_artifact`: the job's `answer.json` must hold every checked key with its exact sum."""

from __future__ import annotations

import json
from typing import Any

from graders.assets.datasets import read_jsonl
from graders.checkpoint_files import (
    InvalidCheckpoint,
    agent_bytes,
    checkpoint_root,
    read_bounded,
    scan_output_tree,
)
from graders.inputs import GraderInputs
from graders.result import GraderResult
from graders.scoring import artifact_matches
from graders.tasks import DATASET_FILE, Task

GRADER_VERSION = "artifact/2"
ANSWER_FILE = "answer.json"
MAX_ANSWER_BYTES = 1 << 20


def _refuse_constant(name: str) -> object:
    raise InvalidCheckpoint(f"{ANSWER_FILE} is not strict JSON: {name} is not a JSON value")


def _read_answer(inputs: GraderInputs) -> dict[str, Any]:
    root = scan_output_tree(inputs.checkpoint)
    path = root / ANSWER_FILE
    if not path.exists():
        raise InvalidCheckpoint(f"no {ANSWER_FILE} in the job's outputs")
    try:
        answer = json.loads(
            read_bounded(path, MAX_ANSWER_BYTES).decode("utf-8"), parse_constant=_refuse_constant
        )
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidCheckpoint(f"{ANSWER_FILE} is not valid JSON: {exc}") from None
    if not isinstance(answer, dict):
        raise InvalidCheckpoint(f"{ANSWER_FILE} must hold a JSON object, not a {type(answer).__name__}")
    return answer


def grade(task: Task, inputs: GraderInputs) -> GraderResult:
    checks = read_jsonl(inputs.split / DATASET_FILE)
    checkpoint_root(inputs.checkpoint)  # a missing mount is the platform's failure, not the agent's
    try:
        with agent_bytes(f"{ANSWER_FILE} cannot be read"):
            answer = _read_answer(inputs)
            passed, matched = artifact_matches(answer, checks)
    except InvalidCheckpoint as exc:
        return GraderResult.invalid_checkpoint(str(exc), GRADER_VERSION)
    return GraderResult(
        score=1.0 if passed else 0.0,
        n=len(checks),
        status="ok",
        details={"matched_keys": matched},
        grader_version=GRADER_VERSION,
    )
