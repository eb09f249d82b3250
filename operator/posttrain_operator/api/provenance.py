"""ProvenanceRecord: an Episode's append-only record of what its agent did (docs/provenance.md).

Each record is an immutable object (the schema refuses any change to its spec) in the Episode's
namespace, owned by the Episode. Two writers append, each under names that make a second write of
the same record fail rather than duplicate it:
- the gateway: the agent's tool calls, in batches, as a chain `<episode>-calls-<sequence>`, each
  holding the sha256 of the one before (a gap or a replaced record shows);
- the operator: one record per AgentJob once it is terminal (`<job>-job`), and the submission's
  lineage back to the base model (`<episode>-submission`).
Agent jobs hold no credential to the API server, and neither writer may update or delete a record.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Any, Literal

from pydantic import Field

from posttrain_operator.api.episode import ProvenanceSummary
from posttrain_operator.api.models import (
    EPISODE_LABEL,
    GROUP,
    MAX_DATASETS,
    MAX_INPUTS_FROM,
    MAX_INSTALLED_PACKAGES,
    MAX_LINEAGE,
    NAME_PATTERN,
    SHA256_PATTERN,
    VERSION,
    AgentJobSpec,
    AgentJobStatus,
    ApiModel,
    InstalledPackage,
    JobName,
    MountedRepo,
)

FORMAT = "posttrain.dev/provenance/v1"
MAX_TOOL_CALLS = 256  # per record: a batch of calls the gateway counted at once
GENESIS = "0" * 64  # `previous` of a chain's first record
Writer = Literal["gateway", "operator"]
RECORD_SUFFIXES = ("-job", "-submission")


class ToolCall(ApiModel):
    at: str = Field(max_length=40, description="at is when the call ended (RFC 3339).")
    tool: str = Field(max_length=64, description="tool is the tool's name.")
    argument_bytes: int = Field(ge=0, description="argumentBytes is the size of the arguments as JSON.")
    arguments_sha256: str = Field(pattern=SHA256_PATTERN, description="argumentsSha256 hashes them.")
    result: str = Field(max_length=64, description="result is ok or the error code the agent was given.")
    spent_micro_usd: int = Field(
        alias="spentMicroUSD",
        ge=0,
        description="spentMicroUSD is the Episode's settled spend as the call saw it.",
    )
    job: str | None = Field(default=None, max_length=253, description="job names the AgentJob it created.")


class JobEntry(ApiModel):
    job: str = Field(max_length=253, pattern=NAME_PATTERN, description="job names the AgentJob.")
    purpose: str = Field(max_length=16, description="purpose is train, devEval or score.")
    phase: str = Field(max_length=16, description="phase is the job's terminal phase.")
    reason: str | None = Field(default=None, max_length=128, description="reason is the phase's cause.")
    backend: str | None = Field(default=None, max_length=16, description="backend ran it (none: never sent).")
    backend_job_id: str | None = Field(
        default=None, max_length=253, description="backendJobId is its id there."
    )
    flavor: str = Field(max_length=64, description="flavor is the hardware it asked for.")
    image: str | None = Field(default=None, max_length=512, description="image is the image it ran in.")
    script_sha256: str = Field(pattern=SHA256_PATTERN, description="scriptSha256 hashes spec.script.")
    packages: list[InstalledPackage] = Field(
        default_factory=list, max_length=MAX_INSTALLED_PACKAGES,
        description="packages are the wheels installed, with their sha256 (where the backend resolved them).",
    )  # fmt: skip
    requirements: list[str] = Field(
        default_factory=list, max_length=32, description="requirements are spec.packages as asked."
    )
    mounts: list[MountedRepo] = Field(
        default_factory=list, max_length=MAX_DATASETS + 3, description="mounts are the Hub repos it read."
    )
    inputs_from: list[JobName] = Field(
        default_factory=list, max_length=MAX_INPUTS_FROM, description="inputsFrom is spec.inputsFrom."
    )
    lineage: list[JobName] = Field(
        default_factory=list, max_length=MAX_LINEAGE, description="lineage is the job's (nearest first)."
    )
    checkpoint_from: str | None = Field(
        default=None, max_length=253, description="checkpointFrom is what a grader job graded."
    )
    billed_seconds: int | None = Field(
        default=None, ge=0, description="billedSeconds is the run time billed."
    )
    settled_micro_usd: int = Field(
        default=0, alias="settledMicroUSD", ge=0, description="settledMicroUSD is what the agent paid."
    )
    started_at: str | None = Field(default=None, max_length=40, description="startedAt, from the backend.")
    finished_at: str | None = Field(default=None, max_length=40, description="finishedAt, when it ended.")


class SubmissionEntry(ApiModel):
    checkpoint_from: str = Field(max_length=253, description="checkpointFrom is the submitted job.")
    lineage: list[JobName] = Field(
        default_factory=list, max_length=MAX_LINEAGE, description="lineage is that job's, nearest first."
    )
    base_model: str | None = Field(
        default=None, max_length=400, description="baseModel is the task's, as repo@revision."
    )
    at: str = Field(max_length=40, description="at is when scoring started.")


class ProvenanceSpec(ApiModel):
    format: Literal["posttrain.dev/provenance/v1"] = Field(description="format names this schema's version.")
    episode: str = Field(max_length=253, pattern=NAME_PATTERN, description="episode names the Episode.")
    writer: Writer = Field(description="writer is gateway (tool calls) or operator (jobs, submission).")
    sequence: int = Field(
        default=0, ge=0, description="sequence is the record's place in its writer's chain."
    )
    previous: str = Field(
        default=GENESIS, pattern=SHA256_PATTERN,
        description="previous is the digest of the chain's record before (zeros for the first).",
    )  # fmt: skip
    tool_calls: list[ToolCall] = Field(
        default_factory=list, max_length=MAX_TOOL_CALLS, description="toolCalls are the gateway's."
    )
    job: JobEntry | None = Field(default=None, description="job is the operator's record of one AgentJob.")
    submission: SubmissionEntry | None = Field(default=None, description="submission is the final lineage.")


def script_sha256(script: str) -> str:
    """A job's script as the provenance record and a score job know it: the sha256 of the bytes the
    launcher writes into the job's outputs."""
    return hashlib.sha256(script.encode("utf-8", "surrogatepass")).hexdigest()


def digest(spec: ProvenanceSpec) -> str:
    """sha256 of the record's spec in canonical JSON (sorted keys, no spaces)."""
    canonical = json.dumps(spec.wire(), sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(canonical.encode()).hexdigest()


def _bounded(base: str, suffix: str) -> str:
    """`base` + `suffix` within a name's 253 characters (a long base keeps a hash of itself)."""
    if len(base) + len(suffix) <= 253:
        return base + suffix
    tag = hashlib.sha256(base.encode()).hexdigest()[:10]
    return f"{base[: 253 - len(suffix) - 11]}-{tag}{suffix}"


def calls_record_name(episode: str, sequence: int) -> str:
    return _bounded(episode, f"-calls-{sequence:06d}")


def job_record_name(job: str) -> str:
    return _bounded(job, "-job")


def submission_record_name(episode: str) -> str:
    return _bounded(episode, "-submission")


def chain_break(calls: Iterable[ProvenanceSpec]) -> str | None:
    """What is wrong with a gateway chain (its records in any order), or None when it is whole."""
    ordered = sorted(calls, key=lambda spec: spec.sequence)
    previous = GENESIS
    for expected, spec in enumerate(ordered):
        if spec.sequence != expected:
            return f"record {expected} of the tool-call chain is missing"
        if spec.previous != previous:
            return f"record {expected} does not follow record {expected - 1}"
        previous = digest(spec)
    return None


def summarise(specs: Iterable[ProvenanceSpec]) -> ProvenanceSummary:
    specs = list(specs)
    calls = [spec for spec in specs if spec.writer == "gateway"]
    jobs = [spec.job for spec in specs if spec.job is not None]
    return ProvenanceSummary(
        format=FORMAT,
        tool_calls=sum(len(spec.tool_calls) for spec in calls),
        jobs=len(jobs),
        billed_seconds=sum(job.billed_seconds or 0 for job in jobs),
        submission=any(spec.submission is not None for spec in specs),
        chain=chain_break(calls) or "intact",
    )


def specs_of(records: Iterable[dict[str, Any]]) -> list[ProvenanceSpec]:
    return [ProvenanceSpec.model_validate(record["spec"]) for record in records]


def job_entry(job: dict[str, Any], status: AgentJobStatus) -> JobEntry:
    """The record of a job from its spec and its final status."""
    spec = AgentJobSpec.model_validate(job["spec"])
    return JobEntry(
        job=job["metadata"]["name"],
        purpose=spec.purpose,
        phase=status.phase or "",
        reason=status.reason,
        backend=status.backend if status.backend_job_id else None,
        backend_job_id=status.backend_job_id,
        flavor=spec.flavor,
        image=status.image,
        script_sha256=script_sha256(spec.script),
        packages=status.packages,
        requirements=spec.packages,
        mounts=status.mounts,
        inputs_from=spec.inputs_from,
        lineage=status.lineage,
        checkpoint_from=spec.checkpoint_from,
        billed_seconds=status.billed_seconds,
        settled_micro_usd=status.settled_micro_usd,
        started_at=status.started_at,
        finished_at=status.finished_at,
    )


def record(name: str, spec: ProvenanceSpec, owner: dict[str, Any] | None) -> dict[str, Any]:
    """A ProvenanceRecord's body, labelled with (and, given its ownerReference, owned by) its Episode."""
    metadata: dict[str, Any] = {"name": name, "labels": {EPISODE_LABEL: spec.episode}}
    if owner is not None:
        metadata["ownerReferences"] = [owner]
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "ProvenanceRecord",
        "metadata": metadata,
        "spec": spec.wire(),
    }
