"""Grader of `t0_artifact`: the job's `answer.json` must hold every checked key with its exact sum."""

from __future__ import annotations

import json

from graders.assets.datasets import read_jsonl
from graders.checkpoint_files import InvalidCheckpoint, scan_output_tree
from graders.inputs import GraderInputs
from graders.result import GraderResult
from graders.scoring import artifact_matches
from graders.tasks import DATASET_FILE, Task

GRADER_VERSION = "artifact/1"
ANSWER_FILE = "answer.json"
MAX_ANSWER_BYTES = 1 << 20


def _read_answer(inputs: GraderInputs) -> object:
    root = scan_output_tree(inputs.checkpoint)
    path = root / ANSWER_FILE
    if not path.is_file():
        raise InvalidCheckpoint(f"no {ANSWER_FILE} in the job's outputs")
    if path.stat().st_size > MAX_ANSWER_BYTES:
        raise InvalidCheckpoint(f"{ANSWER_FILE} is larger than {MAX_ANSWER_BYTES} bytes")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InvalidCheckpoint(f"{ANSWER_FILE} is not valid JSON: {exc}") from None


def grade(task: Task, inputs: GraderInputs) -> GraderResult:
    checks = read_jsonl(inputs.split / DATASET_FILE)
    try:
        answer = _read_answer(inputs)
    except InvalidCheckpoint as exc:
        return GraderResult.invalid_checkpoint(str(exc), GRADER_VERSION)
    passed, matched = artifact_matches(answer, checks)
    return GraderResult(
        score=1.0 if passed else 0.0,
        n=len(checks),
        status="ok",
        details={"matched_keys": matched},
        grader_version=GRADER_VERSION,
    )
