"""JudgeFinding: a finding a judge (an external reviewer, such as an LLM reading the episode's jobs)
appends to an Episode once it ended (docs/integrity.md, "Judges").

A kind of its own so that RBAC alone decides who may judge: the chart's judge ClusterRole may create
JudgeFindings, and no agent-facing identity may (the gateway may patch Episodes, so nothing on the
Episode itself could carry a judge's word). The schema refuses a malformed finding before the
operator sees it; the operator refuses one on an Episode that has not ended, in its status.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field

from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.api.models import MAX_FINDINGS, NAME_PATTERN, ApiModel, IntegrityFinding
from posttrain_operator.api.rules import has_ended, integrity_of

JudgePhase = Literal["Applied", "Refused"]
SourceLabel = Annotated[str, Field(min_length=1, max_length=200)]


class JudgeFindingSpec(ApiModel):
    episode: str = Field(
        max_length=253, pattern=NAME_PATTERN, description="episode names the judged Episode."
    )
    verdict: Literal["flagged", "violation"] = Field(
        description="verdict is flagged (a finding recorded) or violation (the judge calls the reward "
        "undeserved); the Episode's integrity label takes the worst of its findings."
    )
    summary: str = Field(min_length=1, max_length=512, description="summary says what the judge found.")
    where: list[SourceLabel] = Field(
        default_factory=list,
        max_length=8,
        description="where names the sources (e.g. script:<job>, outputs:<job>/<path>, a provenance entry).",
    )
    figures: dict[str, str] = Field(
        default_factory=dict, max_length=16, description="figures are the judge's numbers, as strings."
    )


class JudgeFindingStatus(ApiModel):
    phase: JudgePhase | None = Field(
        default=None, description="phase is Applied (appended to the Episode) or Refused (nothing changed)."
    )
    reason: str | None = Field(
        default=None, max_length=128, description="reason is a PascalCase cause (e.g. EpisodeNotEnded)."
    )
    message: str | None = Field(default=None, max_length=1024, description="message explains the phase.")


def judged(
    status: EpisodeStatus, name: str, spec: JudgeFindingSpec
) -> EpisodeStatus | JudgeFindingStatus | None:
    """The Episode's status with JudgeFinding `name` appended; a refusal, which changes nothing; or None
    when it is there already (the operator applied it, then stopped before saying so).

    The outcome and the reward stay as the Episode ended with them: the reward may have been read
    already. A consumer that waits for judges reads the label."""
    if not has_ended(status):
        return refused(
            "EpisodeNotEnded",
            f"the Episode is {status.phase or 'Pending'}: a judge's finding is appended once it has ended",
        )
    findings = status.integrity.findings if status.integrity is not None else []
    if any(f.source == name for f in findings):
        return None
    if len(findings) >= MAX_FINDINGS:
        return refused("FindingsFull", f"the Episode holds {MAX_FINDINGS} findings, the most it may")
    finding = IntegrityFinding(
        check="judge",
        verdict=spec.verdict,
        summary=spec.summary,
        where=spec.where,
        figures=spec.figures,
        source=name,
    )
    return status.model_copy(update={"integrity": integrity_of([*findings, finding])})


def refused(reason: str, message: str) -> JudgeFindingStatus:
    return JudgeFindingStatus(phase="Refused", reason=reason, message=message)
