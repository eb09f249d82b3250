"""Task registry: what each task is, what its jobs may mount, and how it is graded.

The operator and the gateway import this module, and neither depends on torch: keep it to the standard
library and pydantic. The grader programs (which do import torch) live in sibling modules.
"""

from __future__ import annotations

from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

# The local assets are built by the project (`python -m graders.assets build`); bump this whenever the
# build recipe changes so every cache and every emulator repo store sees a new revision.
LOCAL_ASSETS_REVISION = "local-v2"
LOCAL_NAMESPACE = "posttrain-operator"

# Every dataset repo holds its records in this one JSON Lines file.
DATASET_FILE = "data.jsonl"

# Input names of a grader job (the launcher exposes each as POSTTRAIN_INPUT_<NAME>).
GRADER_INPUT_BASE_MODEL = "base_model"
GRADER_INPUT_CHECKPOINT = "checkpoint"
GRADER_INPUT_SPLIT = "split"
# Input name under which agent jobs see the task's base model.
AGENT_INPUT_MODEL = "model"

RESULT_FILE = "result.json"


class RepoRef(BaseModel):
    """A pinned Hub repository: what the backend mounts read-only into a job."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: Literal["model", "dataset"]
    repo_id: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
    revision: str = Field(min_length=1)


class TaskLimits(BaseModel):
    """Defaults for `Episode.spec.limits` (field names mirror the CRD in snake_case)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_steps: int = Field(gt=0)
    max_wall_seconds: int = Field(gt=0)
    max_concurrent_jobs: int = Field(gt=0)
    max_job_timeout_seconds: int = Field(gt=0)


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


class Task(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=r"^[a-z][a-z0-9_]*$")
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
    scoring_timeout_seconds: int = Field(gt=0)
    # Module run by `python -m graders.run`; it exposes `grade(task, inputs) -> GraderResult`.
    grader: str = Field(pattern=r"^graders\.[a-z_][a-z0-9_]*$")

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
        for mount in value:
            if not mount.isidentifier() or not mount.islower() or mount == AGENT_INPUT_MODEL:
                raise ValueError(f"bad dataset mount name {mount!r}")
        return value

    def model_post_init(self, context: Any, /) -> None:
        hidden = self.hidden_split
        if hidden in self.agent_datasets.values() or hidden in (self.dev_split, self.base_model):
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
        )

    def grader_split(self, purpose: Literal["devEval", "score"]) -> RepoRef:
        """The split a grader job mounts: dev for the agent's `dev_evaluate`, hidden for `submit`."""
        return self.hidden_split if purpose == "score" else self.dev_split

    def grader_command(self) -> list[str]:
        return ["python", "-m", "graders.run", "--task", self.name]

    def grader_script(self) -> str:
        """Python source for a launcher job of role `grader` (the launcher runs a script, not argv)."""
        return f"import sys\nfrom graders.run import main\nsys.exit(main(['--task', {self.name!r}]))\n"


def _local(kind: Literal["model", "dataset"], name: str) -> RepoRef:
    return RepoRef(kind=kind, repo_id=f"{LOCAL_NAMESPACE}/{name}", revision=LOCAL_ASSETS_REVISION)


_ARTIFACT_DESCRIPTION = """\
Produce an artifact from a dataset. No model is involved.

Input: the dataset mounted at $POSTTRAIN_INPUT_RECORDS holds `data.jsonl`, one JSON object per line:
{"key": "<string>", "value": <integer>}.

Submit a job that writes the file `answer.json` directly in $POSTTRAIN_OUTPUT_DIR: one JSON object
mapping every distinct key of the input to the sum of the values on its lines, as an integer, e.g.
{"k00": 1234, "k01": -56}. Then call `dev_evaluate` with that job to check it, and `submit` it.
The score is 1 when every key is present with its exact sum, else 0. The output dir must hold no
symlinks and no pickle files (*.bin, *.pt, *.pth, *.pkl, *.pickle, *.ckpt, *.joblib, *.npy, *.npz).
"""

_ARITHMETIC_DESCRIPTION = """\
Post-train a tiny character-level causal LM (LlamaForCausalLM, about 0.6 M parameters) to answer
additions of two integers from 0 to 19 in an exact format. The base model knows sums in the format
`a+b=s` but not the required one.

Prompt (exactly, no trailing space):  "Q: {a}+{b}\\nA:"
Required completion (greedy decoding):  " #### {a+b}" followed by the end-of-sequence token
(a newline also ends the answer). Example: "Q: 3+14\\nA:" -> " #### 17". Anything else is wrong.
The score is the exact-match accuracy on a hidden split of such prompts.

Inputs of your jobs (read-only): the base model (config, tokenizer, safetensors weights) at
$POSTTRAIN_INPUT_MODEL; training data at $POSTTRAIN_INPUT_TRAIN/data.jsonl and the public dev split at
$POSTTRAIN_INPUT_DEV/data.jsonl, one JSON object per line: {"prompt": ..., "completion": ...}
(the dev split has {"prompt": ..., "answer": ...}). Jobs have no network and run on CPU.

Your checkpoint is the output dir ($POSTTRAIN_OUTPUT_DIR) of a job: write the weights there with
`model.save_pretrained(os.environ["POSTTRAIN_OUTPUT_DIR"])` (safetensors). Only `*.safetensors` files
directly in that dir are read; the architecture, config and tokenizer always come from the base model,
so every tensor name and shape must match it exactly (no missing or extra tensors). An output dir with
symlinks or pickle files (*.bin, *.pt, *.pth, *.pkl, *.pickle, *.ckpt, *.joblib, *.npy, *.npz) is
rejected with score 0. Check a checkpoint with `dev_evaluate`, then `submit` the job whose outputs
hold your final checkpoint.
"""

_TASKS: dict[str, Task] = {
    task.name: task
    for task in (
        Task(
            name="t0_artifact",
            description=_ARTIFACT_DESCRIPTION,
            base_model=None,
            agent_datasets={"records": _local("dataset", "t0-artifact-records")},
            dev_split=_local("dataset", "t0-artifact-dev-checks"),
            hidden_split=_local("dataset", "t0-artifact-hidden-checks"),
            default_flavors=["cpu-basic", "cpu-upgrade"],
            # A correct job runs in seconds; 10 minute jobs on cpu-upgrade reserve $0.005 each.
            limits=TaskLimits(
                max_steps=30, max_wall_seconds=1200, max_concurrent_jobs=2, max_job_timeout_seconds=600
            ),
            default_budget_usd="0.05",
            scoring_timeout_seconds=300,
            grader="graders.artifact",
        ),
        Task(
            name="t0_arithmetic_format",
            description=_ARITHMETIC_DESCRIPTION,
            base_model=_local("model", "t0-arithmetic-base"),
            agent_datasets={
                "train": _local("dataset", "t0-arithmetic-train"),
                "dev": _local("dataset", "t0-arithmetic-dev"),
            },
            dev_split=_local("dataset", "t0-arithmetic-dev"),
            hidden_split=_local("dataset", "t0-arithmetic-hidden"),
            default_flavors=["cpu-basic", "cpu-upgrade"],
            # An SFT that reaches the bar takes a few minutes; a 30 minute cpu-upgrade job reserves
            # $0.015, so the budget covers about 15 worst-case jobs plus dev evaluations.
            limits=TaskLimits(
                max_steps=60, max_wall_seconds=3600, max_concurrent_jobs=2, max_job_timeout_seconds=1800
            ),
            default_budget_usd="0.25",
            scoring_timeout_seconds=900,
            grader="graders.arithmetic_format",
        ),
    )
}


class UnknownTaskError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown task {self.name!r}; known tasks: {', '.join(task_names())}"


def task_names() -> list[str]:
    return sorted(_TASKS)


def get_task(name: str) -> Task:
    try:
        return _TASKS[name]
    except KeyError:
        raise UnknownTaskError(name) from None


def all_tasks() -> list[Task]:
    return [_TASKS[name] for name in task_names()]
