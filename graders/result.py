"""The grader result file (docs/architecture.md, "Grader results"). Torch-free: the operator reads it."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from graders.integrity.policy import MAX_FINDINGS, Finding
from graders.tasks import RESULT_FILE

ResultStatus = Literal["ok", "invalid_checkpoint", "error"]
MAX_REASON_CHARS = 500


class GraderResult(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    score: float = Field(ge=0.0, le=1.0)
    n: int = Field(ge=0)
    status: ResultStatus
    reason: str | None = None
    details: dict[str, Any] = Field(default_factory=dict)
    grader_version: str
    # (low, high) of the score's 95% interval, for graders that report one (e.g. over seeds).
    interval: tuple[float, float] | None = None
    # What the score job's integrity checks found (graders/integrity); a devEval result has none.
    findings: list[Finding] = Field(default_factory=list, max_length=MAX_FINDINGS)

    @field_validator("interval")
    @classmethod
    def _ordered_within_unit(cls, value: tuple[float, float] | None) -> tuple[float, float] | None:
        if value is not None and not (0.0 <= value[0] <= value[1] <= 1.0):
            raise ValueError(f"interval must be ordered within [0, 1], got {list(value)}")
        return value

    @field_validator("score")
    @classmethod
    def _finite(cls, value: float) -> float:
        if not math.isfinite(value):
            raise ValueError("score must be finite")
        return value

    @field_validator("reason")
    @classmethod
    def _bounded(cls, value: str | None) -> str | None:
        # Reasons may quote agent-chosen names (tensor keys, file names): keep them short.
        if value is not None and len(value) > MAX_REASON_CHARS:
            return value[: MAX_REASON_CHARS - 3] + "..."
        return value

    @classmethod
    def invalid_checkpoint(cls, reason: str, grader_version: str) -> GraderResult:
        return cls(score=0.0, n=0, status="invalid_checkpoint", reason=reason, grader_version=grader_version)

    @classmethod
    def error(cls, reason: str, grader_version: str) -> GraderResult:
        return cls(score=0.0, n=0, status="error", reason=reason, grader_version=grader_version)


def write_result(output_dir: Path, result: GraderResult) -> Path:
    """Write result.json atomically, so a reader never sees half a file."""
    output_dir.mkdir(parents=True, exist_ok=True)
    final = output_dir / RESULT_FILE
    scratch = output_dir / f".{RESULT_FILE}.partial"
    scratch.write_text(json.dumps(result.model_dump(mode="json"), sort_keys=True) + "\n", encoding="utf-8")
    os.replace(scratch, final)
    return final


def read_result(output_dir: Path) -> GraderResult:
    return GraderResult.model_validate_json((output_dir / RESULT_FILE).read_text(encoding="utf-8"))
