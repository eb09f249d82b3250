"""Typed boundary of the gateway: tool arguments (strict, bounded), tool results, typed errors, and the
observation every path returns."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from posttrain_operator.api.models import (
    MAX_DATASETS,
    MAX_INPUTS_FROM,
    MAX_PACKAGES,
    MAX_REQUIREMENT_CHARS,
    MAX_SCRIPT_BYTES,
    Script,
)
from pydantic import BaseModel, ConfigDict, Field, StringConstraints, model_validator

JobName = Annotated[
    str, StringConstraints(min_length=1, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
]
Requirement = Annotated[str, StringConstraints(min_length=1, max_length=MAX_REQUIREMENT_CHARS)]
DatasetName = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")]
Flavor = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z0-9-]+$")]


class Args(BaseModel):
    """Every tool's arguments: unknown keys and type coercions are refused."""

    model_config = ConfigDict(extra="forbid", strict=True)


class NoArgs(Args):
    pass


class SubmitJobArgs(Args):
    script: Script = Field(
        min_length=1,
        max_length=MAX_SCRIPT_BYTES,
        description="Python source the job runs (<= 256 KiB, UTF-8).",
    )
    packages: list[Requirement] = Field(
        default_factory=list, max_length=MAX_PACKAGES, description="pip requirements, wheels only."
    )
    flavor: Flavor | None = Field(default=None, description="Hardware flavor; default: the task's first.")
    timeout_seconds: int = Field(
        default=600, ge=60, le=86400, description="Hard time limit; the job reserves price x minutes."
    )
    datasets: list[DatasetName] | None = Field(
        default=None, max_length=MAX_DATASETS, description="Dataset mounts; default: all the task allows."
    )
    inputs_from: list[JobName] = Field(
        default_factory=list,
        max_length=MAX_INPUTS_FROM,
        description="Succeeded train jobs of this episode whose outputs the job reads (a checkpoint to "
        "resume or fine-tune further, a tokenized dataset), read-only at $POSTTRAIN_INPUT_FROM_<i>.",
    )


class JobArgs(Args):
    job: JobName = Field(description="An AgentJob name of this episode.")


class JobsStatusArgs(Args):
    job: JobName | None = Field(default=None, description="One job, or omit for every job of the episode.")


MAX_WAIT_JOBS = 16


class JobsWaitArgs(Args):
    job: JobName | None = Field(
        default=None,
        description="One job to wait for until it finishes; omit job and jobs to wait for the "
        "episode's end (after submit).",
    )
    jobs: list[JobName] = Field(
        default_factory=list,
        max_length=MAX_WAIT_JOBS,
        description="Several jobs: wait until any of them changes phase (e.g. starts or finishes).",
    )
    timeout_seconds: float = Field(
        default=20.0,
        gt=0,
        le=3600,
        description="How long to wait, within the gateway's limit (task_info: max_wait_seconds); "
        "your client must wait as long (MCP SDK clients read for 300 s by default).",
    )

    @model_validator(mode="after")
    def _one_target(self) -> JobsWaitArgs:
        if self.job is not None and self.jobs:
            raise ValueError("give job or jobs, not both")
        return self


class JobsLogsArgs(Args):
    job: JobName
    tail: int = Field(default=100, ge=1, le=1000, description="Last N lines (1..1000).")


class ReadArtifactArgs(Args):
    job: JobName
    path: str = Field(
        min_length=1,
        max_length=1024,
        description="A file in the job's outputs, relative to them (e.g. metrics.json or "
        "posttrain-job.log); UTF-8 text of at most 256 KiB.",
    )


class DevEvaluateArgs(Args):
    job: JobName = Field(description="The train job whose outputs are scored on the public dev split.")
    timeout_seconds: int = Field(default=300, ge=60, le=86400)


# --- results -----------------------------------------------------------------------------------


class JobView(BaseModel):
    name: str
    purpose: str
    phase: str
    reason: str | None = None
    message: str | None = None
    flavor: str | None = None
    timeout_seconds: int | None = None
    checkpoint_from: str | None = None
    inputs_from: list[str] = Field(default_factory=list)
    network: str | None = Field(
        default=None, description="unix (AF_UNIX sockets only) or loopback (TCP/UDP on lo too)."
    )
    lineage: list[str] = Field(
        default_factory=list, description="Every job whose outputs this one built on, nearest first."
    )
    installed: list[str] = Field(
        default_factory=list,
        description="The wheels installed for its packages, dependencies included (name==version), where "
        "the backend resolves them.",
    )
    reserved_usd: str | None = None
    spent_usd: str | None = None
    exit_code: int | None = Field(
        default=None,
        description="The job's exit code once it ended, where its backend tells it (null otherwise, "
        "e.g. after a timeout or a cancel).",
    )
    started_at: str | None = None
    finished_at: str | None = None
    artifacts: list[dict[str, Any]] = Field(default_factory=list)
    result: dict[str, Any] | None = None
    deleting: bool = False


class JobsResult(BaseModel):
    jobs: list[JobView]


class JobResult(BaseModel):
    job: JobView


class WaitResult(BaseModel):
    finished: bool
    job: JobView | None = None
    jobs: list[JobView] | None = None
    changed: list[str] | None = Field(
        default=None, description="Of `jobs`, those whose phase changed during the wait."
    )
    episode_phase: str | None = None
    outcome: str | None = None
    reward: str | None = None
    reward_interval: list[str] | None = Field(
        default=None, description="The reward's 95% interval [low, high], where the task's grader gives one."
    )
    integrity: str | None = Field(
        default=None, description="The reward's integrity label once scored: clean, flagged or violation."
    )


class LogsResult(BaseModel):
    job: str
    lines: list[str]
    truncated: bool


class ArtifactResult(BaseModel):
    job: str
    path: str
    size: int
    text: str


class CancelResult(BaseModel):
    job: str
    cancelling: bool
    message: str


class SubmitResult(BaseModel):
    submitted: str
    message: str


# --- errors ------------------------------------------------------------------------------------

# OpenEnv's ToolError.error_type enum (clients reject anything else); our own code goes in metadata.
ErrorType = Literal["execution_error", "invalid_args", "transport_error", "tool_not_found", "timeout"]


class ToolFailure(Exception):
    """A typed, expected refusal: shown to the agent, never a 500."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        error_type: ErrorType = "execution_error",
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.error_type = error_type
        self.details = details or {}

    def as_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


class ServiceSpend(BaseModel):
    """Dollar amounts as decimal strings, like every amount in the API (never a float)."""

    budget_usd: str
    reserved_usd: str
    settled_usd: str
    remaining_usd: str
    jobs_running: int


class Outcome(BaseModel):
    """What one tool call produced, independent of the wire it goes out on."""

    tool_name: str
    result: dict[str, Any] | None = None
    error: ToolFailure | None = None
    done: bool = False
    reward: float | None = None
    metadata: dict[str, Any] = Field(default_factory=dict)

    model_config = ConfigDict(arbitrary_types_allowed=True)

    def error_view(self) -> dict[str, str] | None:
        # Exactly {error_type, message}: the 0.10 client refuses extra keys here.
        if self.error is None:
            return None
        return {"error_type": self.error.error_type, "message": f"{self.error.code}: {self.error.message}"}
