"""Seeded dataset repos of the local tasks (standard library only)."""

from __future__ import annotations

import json
import random
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from graders.tasks import DATASET_FILE

ARITHMETIC_SEED = 20240601
ARITHMETIC_OPERAND_MAX = 19
ARITHMETIC_HIDDEN_SIZE = 100
ARITHMETIC_DEV_SIZE = 100

ARTIFACT_SEED = 7
ARTIFACT_KEYS = 40
ARTIFACT_LINES = 2000
ARTIFACT_DEV_KEYS = 10


def arithmetic_prompt(a: int, b: int) -> str:
    return f"Q: {a}+{b}\nA:"


def arithmetic_completion(answer: int | str) -> str:
    return f" #### {answer}"


def write_jsonl(path: Path, records: Iterable[Mapping[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as stream:
        for record in records:
            stream.write(json.dumps(record, sort_keys=True) + "\n")


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as stream:
        return [json.loads(line) for line in stream if line.strip()]


def arithmetic_splits() -> dict[str, list[dict[str, Any]]]:
    """Every operand pair lands in exactly one split, so no hidden prompt is trained on or seen in dev."""
    pairs = [(a, b) for a in range(ARITHMETIC_OPERAND_MAX + 1) for b in range(ARITHMETIC_OPERAND_MAX + 1)]
    random.Random(ARITHMETIC_SEED).shuffle(pairs)
    hidden = pairs[:ARITHMETIC_HIDDEN_SIZE]
    dev = pairs[ARITHMETIC_HIDDEN_SIZE : ARITHMETIC_HIDDEN_SIZE + ARITHMETIC_DEV_SIZE]
    train = pairs[ARITHMETIC_HIDDEN_SIZE + ARITHMETIC_DEV_SIZE :]
    return {
        "train": [
            {"prompt": arithmetic_prompt(a, b), "completion": arithmetic_completion(a + b)} for a, b in train
        ],
        "dev": [{"prompt": arithmetic_prompt(a, b), "answer": str(a + b)} for a, b in dev],
        "hidden": [{"prompt": arithmetic_prompt(a, b), "answer": str(a + b)} for a, b in hidden],
    }


def artifact_records() -> list[dict[str, Any]]:
    rng = random.Random(ARTIFACT_SEED)
    keys = [f"k{index:02d}" for index in range(ARTIFACT_KEYS)]
    return [{"key": rng.choice(keys), "value": rng.randint(-1000, 1000)} for _ in range(ARTIFACT_LINES)]


def artifact_expected(records: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    sums: dict[str, int] = {}
    for record in records:
        sums[record["key"]] = sums.get(record["key"], 0) + int(record["value"])
    return sums


def artifact_checks() -> dict[str, list[dict[str, Any]]]:
    """Dev checks a seeded subset of keys; the hidden checks cover every key."""
    expected = artifact_expected(artifact_records())
    keys = sorted(expected)
    dev_keys = sorted(random.Random(ARTIFACT_SEED + 1).sample(keys, ARTIFACT_DEV_KEYS))
    return {
        "dev": [{"key": key, "expected": expected[key]} for key in dev_keys],
        "hidden": [{"key": key, "expected": expected[key]} for key in keys],
    }


def write_dataset_repo(repo_dir: Path, records: Iterable[Mapping[str, Any]]) -> None:
    write_jsonl(repo_dir / DATASET_FILE, records)
