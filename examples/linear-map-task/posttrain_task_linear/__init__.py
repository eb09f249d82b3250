"""Task `t1_linear_map`: recover an integer linear map from examples; exact match on a held-out set.

A task written as a plugin (docs/tasks.md walks through it). This module is what the operator and the
gateway import, so it stays light: the repo builders (`.assets`) and the grader (`.grader`) are named
by module and imported only where they run.
"""

from __future__ import annotations

from graders.tasks import AssetLocation, Task, TaskLimits, TaskPlugin
from posttrain_task_linear.data import INPUT_SIZE, OUTPUT_SIZE

DESCRIPTION = f"""\
Recover a hidden linear map y = W x, where W is an integer matrix of shape ({OUTPUT_SIZE}, {INPUT_SIZE}).
No model is involved.

Inputs of your jobs (read-only): examples at $POSTTRAIN_INPUT_TRAIN/data.jsonl and the public dev split
at $POSTTRAIN_INPUT_DEV/data.jsonl, one JSON object per line: {{"x": [{INPUT_SIZE} integers],
"y": [{OUTPUT_SIZE} integers]}}. Jobs have no network and run on CPU; numpy and safetensors are installed.

Your checkpoint is the output dir ($POSTTRAIN_OUTPUT_DIR) of a job: one `*.safetensors` file directly in
it holding a float tensor `weight` of shape [{OUTPUT_SIZE}, {INPUT_SIZE}] and, optionally, `bias` of shape
[{OUTPUT_SIZE}], and no other tensor (e.g. `safetensors.numpy.save_file({{"weight": w}}, path)`). A held-out
example counts when every component of round(weight @ x + bias) equals y; the score is the fraction
that count. Check a checkpoint with `dev_evaluate`, then `submit` the job that wrote it.
"""


def define(assets: AssetLocation) -> Task:
    return Task(
        name="t1_linear_map",
        description=DESCRIPTION,
        base_model=None,
        agent_datasets={"train": assets.dataset("t1-linear-train"), "dev": assets.dataset("t1-linear-dev")},
        dev_split=assets.dataset("t1-linear-dev"),
        hidden_split=assets.dataset("t1-linear-hidden"),
        default_flavors=["cpu-basic"],
        # A least-squares fit runs in seconds; a 10 minute cpu-basic job reserves under $0.002.
        limits=TaskLimits(
            max_steps=30, max_wall_seconds=1200, max_concurrent_jobs=2, max_job_timeout_seconds=600
        ),
        default_budget_usd="0.05",
        scoring_timeout_seconds=300,
        grader="posttrain_task_linear.grader",
    )


PLUGIN = TaskPlugin(define=define, assets="posttrain_task_linear.assets")
