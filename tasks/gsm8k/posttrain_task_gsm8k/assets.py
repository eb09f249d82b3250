"""Builders of the stand-in's repos, by repo name (`TaskPlugin.assets`). The real task's repos are
not built: they are the Hub's (the base model) and GSM8K republished (docs/tasks.md)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from graders.tasks import DATASET_FILE
from posttrain_task_gsm8k import STANDIN_REPOS
from posttrain_task_gsm8k.standin import build_model, splits


def _split(name: str) -> Callable[[Path, Callable[[str], None]], None]:
    def build(path: Path, progress: Callable[[str], None]) -> None:
        lines = (json.dumps(record, sort_keys=True) + "\n" for record in splits()[name])
        (path / DATASET_FILE).write_text("".join(lines), encoding="utf-8")

    return build


BUILDERS = {
    STANDIN_REPOS["base"]: build_model,
    **{STANDIN_REPOS[split]: _split(split) for split in ("train", "dev", "hidden")},
}
