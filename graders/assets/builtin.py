"""Builders of the built-in tasks' repos, by repo name (see `graders.tasks.TaskPlugin.assets`)."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from graders.assets import datasets

Progress = Callable[[str], None]


def _build_base_model(path: Path, progress: Progress) -> None:
    # Takes effect only if torch is not loaded yet: spinning OpenMP threads starve each other on a
    # shared CPU (passive waiting measured 3-5x faster on a busy 2-core machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from graders.assets.tiny_model import pretrain_base_model  # torch is needed only here

    pretrain_base_model(path, progress=progress)


def _dataset(records: Callable[[], list[dict[str, Any]]]) -> Callable[[Path, Progress], None]:
    def build(path: Path, progress: Progress) -> None:
        datasets.write_dataset_repo(path, records())

    return build


BUILDERS: dict[str, Callable[[Path, Progress], None]] = {
    "t0-arithmetic-base": _build_base_model,
    "t0-arithmetic-train": _dataset(lambda: datasets.arithmetic_splits()["train"]),
    "t0-arithmetic-dev": _dataset(lambda: datasets.arithmetic_splits()["dev"]),
    "t0-arithmetic-hidden": _dataset(lambda: datasets.arithmetic_splits()["hidden"]),
    "t0-artifact-records": _dataset(datasets.artifact_records),
    "t0-artifact-dev-checks": _dataset(lambda: datasets.artifact_checks()["dev"]),
    "t0-artifact-hidden-checks": _dataset(lambda: datasets.artifact_checks()["hidden"]),
}
