"""What a task is: its model, its limits, the names of its jobs' inputs, and what a plugin registers.

The registry (`graders.tasks`) and the project's own tasks (`graders.builtin_tasks`) import this
module; it imports neither. The operator and the gateway read it, and neither depends on torch: keep it
to the standard library and pydantic.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from graders.integrity.policy import IntegrityPolicy
from graders.job_limits import SMALL_AGENT_JOB, SMALL_GRADER_JOB, JobLimits

# The local assets are built by the project (`python -m graders.assets build`); bump this whenever the
# build recipe changes so every cache and every emulator repo store sees a new revision.
LOCAL_ASSETS_REVISION = "local-v2"
LOCAL_NAMESPACE = "posttrain-operator"
ENTRY_POINT_GROUP = "posttrain.tasks"

# Every dataset repo holds its records in this one JSON Lines file.
DATASET_FILE = "data.jsonl"

# Input names of a grader job (the launcher exposes each as POSTTRAIN_INPUT_<NAME>).
GRADER_INPUT_BASE_MODEL = "base_model"
GRADER_INPUT_CHECKPOINT = "checkpoint"
GRADER_INPUT_SPLIT = "split"


def evidence_input_name(index: int) -> str:
    """A score job's input name of the `index`th job of its submission's lineage."""
    return f"lineage_{index}"


def wheels_input_name(index: int) -> str:
    """A score job's input name of the `index`th job (of the submission and its lineage) whose
    installed wheels it screens."""
    return f"wheels_{index}"


# Input name under which agent jobs see the task's base model.
AGENT_INPUT_MODEL = "model"

RESULT_FILE = "result.json"
# Why a grader job runs: the agent's `dev_evaluate` on the dev split, or the score on the hidden one.
GraderPurpose = Literal["devEval", "score"]


class RepoRef(BaseModel):
    """A pinned Hub repository: what the backend mounts read-only into a job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["model", "dataset"]
    repo_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    revision: str = Field(min_length=1)


ENVIRONMENT_NAME = r"^[a-z][a-z0-9-]{0,31}$"
_REQUIREMENT_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?")


def package_name(requirement: str) -> str:
    """A requirement's project name as PEP 503 compares names (`Foo_Bar>=1` -> `foo-bar`)."""
    found = _REQUIREMENT_NAME.match(requirement.strip())
    return re.sub(r"[-_.]+", "-", found.group(0) if found else requirement).lower()


class TaskLimits(BaseModel):
    """Defaults for `Episode.spec.limits` (field names mirror the CRD in snake_case)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_steps: int = Field(gt=0)
    max_wall_seconds: int = Field(gt=0)
    max_concurrent_jobs: int = Field(gt=0)
    max_job_timeout_seconds: int = Field(ge=60)  # an AgentJob's timeoutSeconds is at least 60


class TaskPublicView(BaseModel):
    """What tools may show the agent. Built from an allow-list, so nothing about the hidden split."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str
    description: str
    base_model: RepoRef | None
    agent_datasets: dict[str, RepoRef]
    default_flavors: list[str]
    limits: TaskLimits
    default_budget_usd: str
    scoring_timeout_seconds: int
    agent_job_limits: JobLimits
    grader_job_limits: JobLimits
    grader_flavor: str | None
    requires_loopback: bool
    requires_sandbox: bool
    agent_environment: str | None
    grader_environment: str | None
    allowed_packages: list[str] | None
    integrity: IntegrityPolicy


class Task(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$", max_length=64)  # as Episode.spec.task
    description: str
    base_model: RepoRef | None
    # Mount name -> repo; the only datasets an agent job may mount (seen at POSTTRAIN_INPUT_<NAME>).
    agent_datasets: dict[str, RepoRef]
    dev_split: RepoRef
    # Mounted only into grader jobs for `submit`; never into agent jobs, never shown by a tool.
    hidden_split: RepoRef
    default_flavors: list[str] = Field(min_length=1)
    limits: TaskLimits
    default_budget_usd: str
    scoring_timeout_seconds: int = Field(ge=60)  # the score job's timeoutSeconds
    # What each agent job and each grader job may write and keep (graders/job_limits.py).
    agent_job_limits: JobLimits = SMALL_AGENT_JOB
    grader_job_limits: JobLimits = SMALL_GRADER_JOB
    # The flavor dev and score grader jobs run on; None: the episode's first (cheapest) flavor.
    grader_flavor: str | None = Field(default=None, min_length=1, max_length=64)
    # Its jobs need TCP/UDP on loopback (torchrun, vLLM): a backend that cannot give it refuses the
    # episode at its start (NetworkUnavailable) rather than run jobs that cannot work.
    requires_loopback: bool = False
    # Its jobs must run under a sandboxing runtime (gVisor, Kata): every flavor the episode may use
    # must be one the platform marks so (pods.sandboxRuntimeClasses), else the episode is refused at
    # its start (SandboxUnavailable). HF Jobs has none.
    requires_sandbox: bool = False
    # The environment image its agent and its grader jobs run in, by name (the chart maps each name
    # to an image per backend: `environments`); None: the launcher's own image. A backend without
    # the image refuses the episode at its start (EnvironmentUnavailable).
    agent_environment: str | None = Field(default=None, pattern=ENVIRONMENT_NAME)
    grader_environment: str | None = Field(default=None, pattern=ENVIRONMENT_NAME)
    # The only packages an agent job may ask for (names, as PEP 503 compares them); None: any.
    allowed_packages: frozenset[str] | None = None
    # What the score job checks beside the grade, what a finding costs, and the `dev_evaluate` rule.
    integrity: IntegrityPolicy = IntegrityPolicy()
    # Module imported by `python -m graders.run` in the grader job (so it must be installed in the job's
    # image); it exposes `GRADER_VERSION` and `grade(task, inputs) -> GraderResult`.
    grader: str = Field(pattern=r"^[a-z_][a-z0-9_]*(\.[a-z_][a-z0-9_]*)+$")

    @field_validator("default_budget_usd")
    @classmethod
    def _budget_is_positive_decimal(cls, value: str) -> str:
        try:
            amount = Decimal(value)
        except InvalidOperation:
            raise ValueError(f"budget must be a decimal string, got {value!r}") from None
        if not amount.is_finite() or amount <= 0:
            raise ValueError(f"budget must be a positive decimal string, got {value!r}")
        return value

    @field_validator("agent_datasets")
    @classmethod
    def _mount_names_are_env_safe(cls, value: dict[str, RepoRef]) -> dict[str, RepoRef]:
        for mount in value:  # as the launcher's input names
            # (`from_<i>` are the outputs of the jobs a train job names in inputsFrom.)
            if (
                not re.fullmatch(r"[a-z][a-z0-9_]{0,63}", mount)
                or mount == AGENT_INPUT_MODEL
                or re.fullmatch(r"from_[0-9]+", mount)
            ):
                raise ValueError(f"bad dataset mount name {mount!r}")
        return value

    def model_post_init(self, context: Any, /) -> None:
        others = [*self.agent_datasets.values(), self.dev_split, self.base_model]
        if self.hidden_split.repo_id in {ref.repo_id for ref in others if ref is not None}:
            raise ValueError(f"task {self.name}: the hidden split must be a repo of its own")

    def public_view(self) -> TaskPublicView:
        return TaskPublicView(
            name=self.name,
            description=self.description,
            base_model=self.base_model,
            agent_datasets=dict(self.agent_datasets),
            default_flavors=list(self.default_flavors),
            limits=self.limits,
            default_budget_usd=self.default_budget_usd,
            scoring_timeout_seconds=self.scoring_timeout_seconds,
            agent_job_limits=self.agent_job_limits,
            grader_job_limits=self.grader_job_limits,
            grader_flavor=self.grader_flavor,
            requires_loopback=self.requires_loopback,
            requires_sandbox=self.requires_sandbox,
            agent_environment=self.agent_environment,
            grader_environment=self.grader_environment,
            allowed_packages=sorted(self.allowed_packages) if self.allowed_packages is not None else None,
            integrity=self.integrity,
        )

    def package_refusal(self, requirements: Iterable[str]) -> str | None:
        """Why these requirements are refused for this task's agent jobs; None when they are not."""
        if self.allowed_packages is None:
            return None
        allowed = {package_name(p) for p in self.allowed_packages}
        outside = sorted({package_name(r) for r in requirements} - allowed)
        if not outside:
            return None
        return (
            f"packages {outside} are not allowed for task {self.name}; "
            f"allowed: {', '.join(sorted(allowed)) or 'none'}"
        )

    def environments(self) -> set[str]:
        """The environment images its jobs need."""
        return {e for e in (self.agent_environment, self.grader_environment) if e is not None}

    def grader_split(self, purpose: GraderPurpose) -> RepoRef:
        """The split a grader job mounts: dev for the agent's `dev_evaluate`, hidden for `submit`."""
        return self.hidden_split if purpose == "score" else self.dev_split

    def grader_argv(
        self,
        purpose: GraderPurpose = "score",
        sample_seed: int | None = None,
        scripts: Sequence[tuple[str, str]] = (),
    ) -> list[str]:
        """`python -m graders.run`'s arguments; `sample_seed` picks a dev evaluation's subsample, where
        the task answers each on a fresh one; `scripts`, (job, sha256), are a score job's evidence."""
        argv = ["--task", self.name, "--purpose", purpose]
        if sample_seed is not None and self.integrity.dev_evaluations.sample_size is not None:
            argv += ["--sample-seed", str(sample_seed)]
        for job, sha256 in scripts:
            argv += ["--script", f"{job}={sha256}"]
        return argv

    def grader_script(
        self,
        purpose: GraderPurpose = "score",
        sample_seed: int | None = None,
        scripts: Sequence[tuple[str, str]] = (),
    ) -> str:
        """Python source for a launcher job of role `grader` (the launcher runs a script, not argv)."""
        argv = self.grader_argv(purpose, sample_seed, scripts)
        return f"import sys\nfrom graders.run import main\nsys.exit(main({argv!r}))\n"


class AssetLocation(BaseSettings):
    """Where the tasks' repos live on the Hub: one namespace and one revision (a tag) for them all.

    Every process that resolves tasks reads the same POSTTRAIN_TASK_ASSETS_* variables (the chart sets
    them on the operator and the gateway alike). The defaults are the project's local build, which the
    devstack's emulator serves; `python -m graders.assets publish` puts the same repos on a real Hub.
    """

    model_config = SettingsConfigDict(env_prefix="POSTTRAIN_TASK_ASSETS_", frozen=True, extra="ignore")

    namespace: str = Field(default=LOCAL_NAMESPACE, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    revision: str = Field(default=LOCAL_ASSETS_REVISION, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")

    def model(self, name: str) -> RepoRef:
        return RepoRef(kind="model", repo_id=f"{self.namespace}/{name}", revision=self.revision)

    def dataset(self, name: str) -> RepoRef:
        return RepoRef(kind="dataset", repo_id=f"{self.namespace}/{name}", revision=self.revision)


@dataclass(frozen=True)
class TaskPlugin:
    """What a task package registers under the `posttrain.tasks` entry-point group (docs/tasks.md).

    `define` returns the task with its repos placed at the configured location (use
    `assets.model(name)` and `assets.dataset(name)`, or pin a repo of your own). `assets` names the
    module that builds those repos, imported only to build or publish them, so heavy imports stay out
    of the operator: it defines `BUILDERS`, a mapping from repo name (the repo id after the namespace)
    to `build(path, progress)`, which writes the repo's files into `path` deterministically.
    """

    define: Callable[[AssetLocation], Task]
    assets: str | None = None
