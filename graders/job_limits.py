"""What one job may write and keep: declared by its task, within maxima the platform sets.

A task states these for its agent jobs and for its grader jobs (`Task.agent_job_limits`,
`Task.grader_job_limits`); the operator copies them into the launcher's job spec, and the backend
sizes the job's scratch from them. The platform's maxima come from the chart (POSTTRAIN_MAX_JOB_*
on the operator and the gateway); a task over any of them is refused when the registry loads.
Standard library and pydantic only: the operator and the gateway import this.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB


class JobLimits(BaseModel):
    """One job's caps. The launcher enforces the first five; the backend bounds the scratch."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_output_bytes: int = Field(ge=1 * KiB, le=1024 * GiB, description="all of the job's outputs")
    max_file_bytes: int = Field(ge=1 * KiB, le=1024 * GiB, description="any one file the job writes")
    max_log_bytes: int = Field(ge=1 * KiB, le=256 * MiB, description="the log the backend keeps")
    max_log_file_bytes: int = Field(ge=0, le=16 * GiB, description="the log's copy in the outputs")
    max_open_files: int = Field(ge=64, le=65536)
    scratch_bytes: int = Field(ge=64 * MiB, le=1024 * GiB, description="HOME and TMPDIR in all")

    @model_validator(mode="after")
    def _file_within_outputs(self) -> JobLimits:
        if self.max_file_bytes > self.max_output_bytes:
            raise ValueError(
                f"max_file_bytes ({self.max_file_bytes}) exceeds max_output_bytes ({self.max_output_bytes})"
            )
        return self

    def launcher_limits(self) -> dict[str, int]:
        """The launcher's `limits` (posttrain_launcher.Limits), the scratch as max_scratch_bytes."""
        limits = self.model_dump(exclude={"scratch_bytes"})
        limits["max_scratch_bytes"] = self.scratch_bytes
        return limits


# Today's limits for the small tasks: a 2 GiB output tree for agent jobs, a result file for graders.
SMALL_AGENT_JOB = JobLimits(
    max_output_bytes=2 * GiB,
    max_file_bytes=2 * GiB,
    max_log_bytes=1 * MiB,
    max_log_file_bytes=64 * MiB,
    max_open_files=1024,
    scratch_bytes=10 * GiB,
)
SMALL_GRADER_JOB = JobLimits(
    max_output_bytes=1 * MiB,
    max_file_bytes=1 * MiB,
    max_log_bytes=256 * KiB,
    max_log_file_bytes=0,
    max_open_files=1024,
    scratch_bytes=10 * GiB,
)


class JobLimitMaxima(BaseSettings):
    """The platform's ceiling on any task's job limits (the chart's `jobLimits.max`)."""

    model_config = SettingsConfigDict(env_prefix="POSTTRAIN_MAX_JOB_", frozen=True, extra="ignore")

    max_output_bytes: int = Field(default=64 * GiB, ge=1 * KiB)
    max_file_bytes: int = Field(default=32 * GiB, ge=1 * KiB)
    max_log_bytes: int = Field(default=16 * MiB, ge=1 * KiB)
    max_log_file_bytes: int = Field(default=1 * GiB, ge=0)
    max_open_files: int = Field(default=65536, ge=64)
    scratch_bytes: int = Field(default=200 * GiB, ge=64 * MiB)

    def excess(self, limits: JobLimits) -> list[str]:
        """Each limit over its maximum, with both numbers; empty when all fit."""
        ceiling = self.model_dump()
        return [
            f"{name} {value} > the platform's {ceiling[name]}"
            for name, value in limits.model_dump().items()
            if value > ceiling[name]
        ]
