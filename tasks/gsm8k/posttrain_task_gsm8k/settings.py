"""What a lab may point the task at: the base model, its flavor and the limits, from the environment
(POSTTRAIN_TASK_GSM8K_*, set by the chart on the operator and the gateway). How answers are generated
and scored is the benchmark's and not a setting (`grader.py`), so a grader job, whose environment
holds none of these, grades as the operator's registry defines the task.

The defaults are PostTrainBench's: a Qwen3 base model, one Hopper-class GPU for ten hours. `standin`
swaps in the project's own tiny model and generated GSM8K-format data (`standin.py`): only the repo ids
change (run it on a CPU flavor with `flavor`), so the same code runs with no Hub and no GPU.
"""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

HOUR = 3600


class Gsm8kSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POSTTRAIN_TASK_GSM8K_", frozen=True, extra="ignore")

    # A Hub model repo and the revision every job mounts. Pin a commit: a branch moves under a tag.
    base_model: str = Field(
        default="Qwen/Qwen3-1.7B-Base", pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$"
    )
    base_revision: str = Field(default="main", pattern=r"^[A-Za-z0-9][\w.-]{0,63}$")
    # GSM8K as its authors published it on the Hub (`main/{train,test}-*.parquet`), which `python -m
    # graders.assets publish --task gsm8k` republishes as the task's splits. Pin a commit here too.
    upstream_dataset: str = Field(default="openai/gsm8k", pattern=r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
    upstream_revision: str = Field(default="main", pattern=r"^[A-Za-z0-9][\w.-]{0,63}$")
    # Where GSM8K is republished as the task's three repos (`gsm8k-train`, `gsm8k-dev`, `gsm8k-hidden`),
    # at one revision; the hidden one private.
    datasets_namespace: str = Field(default="posttrain-operator", pattern=r"^[A-Za-z0-9][\w.-]*$")
    datasets_revision: str = Field(default="gsm8k-v1", pattern=r"^[A-Za-z0-9][\w.-]*$")
    # Agent jobs, dev grading and the score job run on this one flavor: h200 is HF Jobs' Hopper flavor
    # (the H100's class; HF Jobs lists no H100).
    flavor: str = Field(default="h200", min_length=1, max_length=64)
    max_wall_seconds: int = Field(default=10 * HOUR, gt=0)
    max_job_timeout_seconds: int = Field(default=10 * HOUR, ge=60)
    scoring_timeout_seconds: int = Field(default=2 * HOUR, ge=60)
    max_steps: int = Field(default=400, gt=0)
    # `dev_evaluate` calls an episode may make (each on a fresh sample of dev).
    dev_evaluations: int = Field(default=20, ge=1, le=10_000)
    standin: bool = False
