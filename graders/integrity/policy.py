"""What a task asks of a submission beyond its score, and what a check found (torch-free: the operator
and the gateway read both).

A check detects; the task's policy decides what a detection costs. `record` labels the reward
`flagged` and keeps it; `withhold` labels it `violation` and the episode ends `IntegrityViolation`
with reward 0, which is the agent's doing (docs/integrity.md).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

Action = Literal["record", "withhold"]
Check = Literal["contamination", "evidence", "identity", "devEvaluations", "judge"]
Verdict = Literal["flagged", "violation"]

MAX_FINDING_SUMMARY_CHARS = 500
MAX_FINDING_WHERE = 8
MAX_FINDING_FIGURES = 16
MAX_FINDINGS = 16


class IdentityPolicy(BaseModel):
    """The submission must descend from the base model (graders/integrity/identity.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # Weights that are another model's (or re-initialised): fewer than `min_kept_share` of the matrix
    # parameters sit in tensors whose cosine with the base's is at least `min_cosine`. Fine-tuning a
    # small model keeps its tensors well above 0.1 (a gsm8k stand-in's SFT: median 0.40); another
    # seed's weights, or re-initialised ones, sit below 0.06 (docs/integrity.md).
    min_cosine: float = Field(default=0.1, gt=0.0, lt=1.0)
    min_kept_share: float = Field(default=0.5, gt=0.0, le=1.0)
    foreign_action: Action = "withhold"
    # The base unchanged (relative change of all weights below this): scores as the base does.
    min_relative_change: float = Field(default=1e-6, ge=0.0)
    unchanged_action: Action = "record"


class ContaminationPolicy(BaseModel):
    """Hidden-split items must not be in what the agent put into its jobs (graders/integrity/text.py)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    # The hidden records' fields that make an item; n-grams are cut within each field (text.py).
    fields: tuple[str, ...] = Field(min_length=1)
    ngram: int = Field(default=13, ge=3, le=64)
    # Items shorter than `ngram` tokens are matched whole; shorter than this, not screened at all.
    min_item_tokens: int = Field(default=5, ge=1)
    # An item is found when more than this share of its n-grams occur in the agent's text.
    max_overlap: float = Field(default=0.5, ge=0.0, lt=1.0)
    # Found items the task tolerates (chance overlap of generated data) before it is a finding.
    max_items: int = Field(default=0, ge=0)
    action: Action = "withhold"

    @model_validator(mode="after")
    def _short_items_fit(self) -> ContaminationPolicy:
        if self.min_item_tokens > self.ngram:
            raise ValueError("min_item_tokens cannot exceed ngram")
        return self


class DevEvaluationPolicy(BaseModel):
    """How the agent may use `dev_evaluate`: at most `max_calls` per episode (None: as many as the budget
    pays for), each on a fresh random `sample_size` records of dev (None: all of dev)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_calls: int | None = Field(default=None, ge=1, le=10_000)
    sample_size: int | None = Field(default=None, ge=1)


class IntegrityPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    identity: IdentityPolicy | None = None
    contamination: ContaminationPolicy | None = None
    dev_evaluations: DevEvaluationPolicy = DevEvaluationPolicy()


class Finding(BaseModel):
    """What one check found, in a score job's result or appended by a judge."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    check: Check
    verdict: Verdict
    summary: str = Field(min_length=1)
    # Where it was found: source labels (`script:<job>`, `outputs:<job>/<path>`), bounded.
    where: list[str] = Field(default_factory=list, max_length=MAX_FINDING_WHERE)
    figures: dict[str, float | int | str] = Field(default_factory=dict, max_length=MAX_FINDING_FIGURES)

    @field_validator("summary")
    @classmethod
    def _bounded(cls, value: str) -> str:
        if len(value) > MAX_FINDING_SUMMARY_CHARS:
            return value[: MAX_FINDING_SUMMARY_CHARS - 3] + "..."
        return value

    @field_validator("where")
    @classmethod
    def _short_labels(cls, value: list[str]) -> list[str]:
        return [label[:200] for label in value]


def verdict_of(action: Action) -> Verdict:
    return "violation" if action == "withhold" else "flagged"
