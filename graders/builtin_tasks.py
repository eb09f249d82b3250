"""The tasks the project ships, registered like any plugin (see `graders.task_model.TaskPlugin`).

Their repos are built by `graders.assets.builtin`; this module stays light, because the operator and
the gateway import it.
"""

from __future__ import annotations

from graders.integrity.policy import ContaminationPolicy, DevEvaluationPolicy, IdentityPolicy, IntegrityPolicy
from graders.job_limits import GiB, JobLimits, MiB
from graders.task_model import AssetLocation, Task, TaskLimits, TaskPlugin

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


def _artifact(assets: AssetLocation) -> Task:
    return Task(
        name="t0_artifact",
        description=_ARTIFACT_DESCRIPTION,
        base_model=None,
        agent_datasets={"records": assets.dataset("t0-artifact-records")},
        dev_split=assets.dataset("t0-artifact-dev-checks"),
        hidden_split=assets.dataset("t0-artifact-hidden-checks"),
        default_flavors=["cpu-basic", "cpu-upgrade"],
        # A correct job runs in seconds; 10 minute jobs on cpu-upgrade reserve $0.005 each.
        limits=TaskLimits(
            max_steps=30, max_wall_seconds=1200, max_concurrent_jobs=2, max_job_timeout_seconds=600
        ),
        default_budget_usd="0.05",
        scoring_timeout_seconds=300,
        grader="graders.artifact",
    )


# An item is a prompt and its sum: five tokens ("q 3 4 a 7"), matched whole. A job may print such
# lines of its own (a model's answers), so a found item is recorded, not held against the reward.
ARITHMETIC_INTEGRITY = IntegrityPolicy(
    identity=IdentityPolicy(),
    contamination=ContaminationPolicy(fields=("prompt", "answer"), min_item_tokens=5, action="record"),
    dev_evaluations=DevEvaluationPolicy(max_calls=20),
)


def _arithmetic_format(assets: AssetLocation) -> Task:
    return Task(
        name="t0_arithmetic_format",
        description=_ARITHMETIC_DESCRIPTION,
        base_model=assets.model("t0-arithmetic-base"),
        agent_datasets={
            "train": assets.dataset("t0-arithmetic-train"),
            "dev": assets.dataset("t0-arithmetic-dev"),
        },
        dev_split=assets.dataset("t0-arithmetic-dev"),
        hidden_split=assets.dataset("t0-arithmetic-hidden"),
        default_flavors=["cpu-basic", "cpu-upgrade"],
        # An SFT that reaches the bar takes a few minutes; a 30 minute cpu-upgrade job reserves
        # $0.015, so the budget covers about 15 worst-case jobs plus dev evaluations.
        limits=TaskLimits(
            max_steps=60, max_wall_seconds=3600, max_concurrent_jobs=2, max_job_timeout_seconds=1800
        ),
        default_budget_usd="0.25",
        scoring_timeout_seconds=900,
        grader="graders.arithmetic_format",
        integrity=ARITHMETIC_INTEGRITY,
    )


def _arithmetic_format_trl(assets: AssetLocation) -> Task:
    """The same task, its agent jobs in the `trl` environment image (trl, peft, accelerate, datasets
    beside the launcher's torch and transformers): a post-training stack, as a real task needs."""
    task = _arithmetic_format(assets)
    description = task.description + _TRL_DESCRIPTION
    update = {
        "name": "t0_arithmetic_format_trl",
        "description": description,
        "agent_environment": "trl",
        "allowed_packages": TRL_EXTRA_PACKAGES,
        "agent_job_limits": CHECKPOINT_JOB,
        "grader_flavor": "cpu-upgrade",
    }
    return task.model_copy(update=update)


# Room for the checkpoints of a real post-training run (a 1.7B model in bf16 is about 3.4 GB, with
# its optimizer state more), its logs, and a dataset cache.
CHECKPOINT_JOB = JobLimits(
    max_output_bytes=16 * GiB,
    max_file_bytes=8 * GiB,
    max_log_bytes=4 * MiB,
    max_log_file_bytes=256 * MiB,
    max_open_files=4096,
    scratch_bytes=32 * GiB,
)

# What a trl job may add to its environment (wheels only, with the image's torch): faster kernels and
# the reward-side helpers trl's recipes name.
TRL_EXTRA_PACKAGES = frozenset({"liger-kernel", "math-verify", "latex2sympy2-extended"})


_TRL_DESCRIPTION = (
    "\n\nYour jobs run in the `trl` environment: `trl` (SFTTrainer, DPOTrainer, GRPOTrainer), `peft`, "
    "`accelerate` and `datasets` are installed beside torch and transformers. `packages` may name only "
    "liger-kernel, math-verify and latex2sympy2-extended."
)

BUILTIN_TASKS = (
    TaskPlugin(define=_artifact, assets="graders.assets.builtin"),
    TaskPlugin(define=_arithmetic_format, assets="graders.assets.builtin"),
    TaskPlugin(define=_arithmetic_format_trl, assets="graders.assets.builtin"),
)
