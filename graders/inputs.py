"""Where a grader job finds its inputs and writes its result (set by the launcher)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from graders.tasks import (
    GRADER_INPUT_BASE_MODEL,
    GRADER_INPUT_CHECKPOINT,
    GRADER_INPUT_SPLIT,
    GraderPurpose,
    evidence_input_name,
    wheels_input_name,
)


def input_env_var(name: str) -> str:
    return f"POSTTRAIN_INPUT_{name.upper()}"


OUTPUT_DIR_ENV = "POSTTRAIN_OUTPUT_DIR"


@dataclass(frozen=True)
class GraderInputs:
    checkpoint: Path
    split: Path
    base_model: Path | None
    purpose: GraderPurpose = "score"
    # The outputs of the jobs the checkpoint was built on (a score job's), by job name.
    lineage: tuple[tuple[str, Path], ...] = ()
    # The sha256 of each of those jobs' scripts, as the operator recorded them, checkpoint's job first.
    scripts: tuple[tuple[str, str], ...] = ()
    # The wheels each of them installed (those that installed any), as the operator staged them, by job.
    wheels: tuple[tuple[str, Path], ...] = ()

    @classmethod
    def from_env(
        cls, env: Mapping[str, str], *, needs_base_model: bool, purpose: GraderPurpose = "score"
    ) -> GraderInputs:
        def required(name: str) -> Path:
            value = env.get(input_env_var(name))
            if not value:
                raise RuntimeError(f"{input_env_var(name)} is not set")
            return Path(value)

        lineage: list[tuple[str, Path]] = []
        while value := env.get(input_env_var(evidence_input_name(len(lineage)))):
            lineage.append((Path(value).name, Path(value)))
        wheels: list[tuple[str, Path]] = []
        while value := env.get(input_env_var(wheels_input_name(len(wheels)))):
            wheels.append((Path(value).name, Path(value)))
        return cls(
            checkpoint=required(GRADER_INPUT_CHECKPOINT),
            split=required(GRADER_INPUT_SPLIT),
            base_model=required(GRADER_INPUT_BASE_MODEL) if needs_base_model else None,
            purpose=purpose,
            lineage=tuple(lineage),
            wheels=tuple(wheels),
        )
