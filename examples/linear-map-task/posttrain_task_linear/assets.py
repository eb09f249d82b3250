"""Builders of the task's repos, by repo name (`TaskPlugin.assets`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from graders.tasks import DATASET_FILE
from posttrain_task_linear.data import splits


def _split(name: str) -> Callable[[Path, Callable[[str], None]], None]:
    def build(path: Path, progress: Callable[[str], None]) -> None:
        lines = (json.dumps(record, sort_keys=True) + "\n" for record in splits()[name])
        (path / DATASET_FILE).write_text("".join(lines), encoding="utf-8")

    return build


BUILDERS = {
    "t1-linear-train": _split("train"),
    "t1-linear-dev": _split("dev"),
    "t1-linear-hidden": _split("hidden"),
}
