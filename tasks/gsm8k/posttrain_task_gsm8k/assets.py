"""Builders of the task's repos, by repo name (`TaskPlugin.assets`): the stand-in's (the project's own
model and data), and GSM8K republished in the splits the task mounts, from the upstream dataset at its
pinned revision (`python -m graders.assets publish --task gsm8k`). The base model is the Hub's own.

The republished splits: `hidden` is GSM8K's test set (1,319 questions); `dev` a seeded sample of 500
questions of its train set, and `train` the rest of it, so dev never overlaps what an agent trains on.
"""

from __future__ import annotations

import functools
import json
import random
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from graders.tasks import DATASET_FILE
from posttrain_task_gsm8k import REPOS, STANDIN_REPOS
from posttrain_task_gsm8k.settings import Gsm8kSettings
from posttrain_task_gsm8k.standin import build_model, splits

DEV_SIZE = 500
DEV_SEED = 20_240_521
UPSTREAM_FILES = {"train": "main/train-*.parquet", "test": "main/test-*.parquet"}
Build = Callable[[Path, Callable[[str], None]], None]


def _writer(records: Callable[[Callable[[str], None]], Iterable[dict[str, Any]]]) -> Build:
    def build(path: Path, progress: Callable[[str], None]) -> None:
        lines = (json.dumps(record, sort_keys=True) + "\n" for record in records(progress))
        (path / DATASET_FILE).write_text("".join(lines), encoding="utf-8")

    return build


@functools.cache
def _upstream(dataset: str, revision: str) -> dict[str, list[dict[str, str]]]:
    """GSM8K's train and test sets as its repo holds them (parquet), downloaded once per process."""
    from huggingface_hub import snapshot_download

    try:
        import pyarrow.parquet as parquet
    except ImportError as exc:  # not a dependency of the graders: only republishing needs it
        raise RuntimeError("republishing GSM8K reads parquet: install pyarrow") from exc
    with tempfile.TemporaryDirectory(prefix="gsm8k-upstream-") as scratch:
        snapshot_download(
            dataset, repo_type="dataset", revision=revision, local_dir=scratch,
            allow_patterns=list(UPSTREAM_FILES.values()),
        )  # fmt: skip
        found: dict[str, list[dict[str, str]]] = {}
        for split, pattern in UPSTREAM_FILES.items():
            files = sorted(Path(scratch).glob(pattern))
            if not files:
                raise RuntimeError(f"{dataset}@{revision} has no {pattern}")
            rows = [row for file in files for row in parquet.read_table(file).to_pylist()]
            found[split] = [{"question": str(r["question"]), "answer": str(r["answer"])} for r in rows]
    return found


def republished(progress: Callable[[str], None]) -> dict[str, list[dict[str, str]]]:
    settings = Gsm8kSettings()
    progress(f"reading {settings.upstream_dataset}@{settings.upstream_revision}")
    upstream = _upstream(settings.upstream_dataset, settings.upstream_revision)
    train = upstream["train"]
    held_out = set(random.Random(DEV_SEED).sample(range(len(train)), min(DEV_SIZE, len(train) // 2)))
    return {
        "train": [r for i, r in enumerate(train) if i not in held_out],
        "dev": [r for i, r in enumerate(train) if i in held_out],
        "hidden": upstream["test"],
    }


def _standin_split(split: str) -> Build:
    return _writer(lambda _progress: splits()[split])


def _republished_split(split: str) -> Build:
    return _writer(lambda progress: republished(progress)[split])


BUILDERS: dict[str, Build] = {
    STANDIN_REPOS["base"]: build_model,
    **{STANDIN_REPOS[split]: _standin_split(split) for split in ("train", "dev", "hidden")},
    **{REPOS[split]: _republished_split(split) for split in ("train", "dev", "hidden")},
}
