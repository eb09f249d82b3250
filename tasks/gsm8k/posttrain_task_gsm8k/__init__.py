"""Task `gsm8k`: GSM8K in the PostTrainBench shape, as a task plugin (docs/tasks.md).

The benchmark's rules are pure and unit-tested: the prompt and chat template the task fixes
(`prompt.py`), answer extraction and exact match as lm-evaluation-harness defines them (`scoring.py`),
the reported score, a mean over seeds with a bootstrap 95% interval (`statistics.py`). The grader
(`grader.py`) and the repo builders (`assets.py`) are named by module and imported only where they run:
the operator and the gateway import this module, which stays light.
"""

from __future__ import annotations

from decimal import Decimal

from graders.integrity.policy import ContaminationPolicy, DevEvaluationPolicy, IdentityPolicy, IntegrityPolicy
from graders.job_limits import GiB, JobLimits, MiB
from graders.tasks import AssetLocation, RepoRef, Task, TaskLimits, TaskPlugin
from posttrain_task_gsm8k.prompt import TEMPERATURE, TOP_P, render
from posttrain_task_gsm8k.settings import HOUR, Gsm8kSettings

NAME = "gsm8k"
# HF Jobs' price of the default flavor (h200), per hour: the default budget is the wall time at it,
# whatever the flavor (a lab on another flavor sets the Episode's budgetUSD).
FLAVOR_USD_PER_HOUR = Decimal("5.00")
STANDIN_REPOS = {
    "base": "gsm8k-standin-base",
    "train": "gsm8k-standin-train",
    "dev": "gsm8k-standin-dev",
    "hidden": "gsm8k-standin-hidden",
}
REPOS = {"train": "gsm8k-train", "dev": "gsm8k-dev", "hidden": "gsm8k-hidden"}

DESCRIPTION = """\
Post-train the base model (mounted read-only at $POSTTRAIN_INPUT_MODEL, Hugging Face layout) to solve
grade-school math word problems (GSM8K).

Data (read-only): $POSTTRAIN_INPUT_TRAIN/data.jsonl and $POSTTRAIN_INPUT_DEV/data.jsonl, one JSON object
per line with GSM8K's fields: "question", and "answer" (worked solution ending in "#### <number>").
The score is on a hidden test set you never see.

How it is graded: each question is put to the model as one user turn in ChatML, always with the
task's own chat template (never your checkpoint's): the model continues this text exactly,
{prompt!r}
where QUESTION is the question. Completions are sampled (temperature {temperature}, top-p {top_p})
with fixed seeds; the answer is the first "#### <number>" (lm-evaluation-harness's strict match;
commas and "$" ignored). The score is the accuracy averaged over several seeds, with a bootstrap 95%
interval.

Your checkpoint is the output dir ($POSTTRAIN_OUTPUT_DIR) of a train job: the base model's tensors, by
the same names and shapes, in *.safetensors files (e.g. `model.save_pretrained(out)`); the grader reads
nothing else from it (no config, no tokenizer, no code). Chain jobs with inputsFrom (resume, SFT then
RL). Check a checkpoint with `dev_evaluate` (one seed, a fresh sample of dev each time, a limited
number of times: `task_info` says how many), then `submit` the job.

Integrity: the submission must be the base model trained (not another model's weights, not the base
unchanged), and no test question or answer may be in what your jobs put into the checkpoint (their
outputs are screened at scoring). A violation makes the reward 0.
""".format(prompt=render("QUESTION"), temperature=TEMPERATURE, top_p=TOP_P)


DEV_QUESTIONS = 200  # a dev evaluation's sample of dev

# PostTrainBench's judge, before the reward: a test question or its worked answer in what the agent
# put into its jobs withholds the reward, as does a submission that is not the base model trained.
IDENTITY = IdentityPolicy()
CONTAMINATION = ContaminationPolicy(fields=("question", "answer"), ngram=13, min_item_tokens=8)


def define(assets: AssetLocation) -> Task:
    settings = Gsm8kSettings()
    if settings.standin:
        base = assets.model(STANDIN_REPOS["base"])
        datasets = {split: assets.dataset(STANDIN_REPOS[split]) for split in ("train", "dev", "hidden")}
    else:
        base = RepoRef(kind="model", repo_id=settings.base_model, revision=settings.base_revision)
        republished = AssetLocation(
            namespace=settings.datasets_namespace, revision=settings.datasets_revision
        )
        datasets = {split: republished.dataset(REPOS[split]) for split in ("train", "dev", "hidden")}
    budget = FLAVOR_USD_PER_HOUR * settings.max_wall_seconds / HOUR
    return Task(
        name=NAME,
        description=DESCRIPTION,
        base_model=base,
        agent_datasets={"train": datasets["train"], "dev": datasets["dev"]},
        dev_split=datasets["dev"],
        hidden_split=datasets["hidden"],
        default_flavors=[settings.flavor],
        grader_flavor=settings.flavor,
        limits=TaskLimits(
            max_steps=settings.max_steps,
            max_wall_seconds=settings.max_wall_seconds,
            max_concurrent_jobs=2,
            max_job_timeout_seconds=settings.max_job_timeout_seconds,
        ),
        default_budget_usd=str(budget.quantize(Decimal("0.01"))),
        scoring_timeout_seconds=settings.scoring_timeout_seconds,
        # A 4B model in bf16 is 8 GB; optimizer state and a second checkpoint fit beside it.
        agent_job_limits=JobLimits(
            max_output_bytes=48 * GiB,
            max_file_bytes=16 * GiB,
            max_log_bytes=8 * MiB,
            max_log_file_bytes=256 * MiB,
            max_open_files=8192,
            scratch_bytes=100 * GiB,
        ),
        grader_job_limits=JobLimits(
            max_output_bytes=4 * MiB,
            max_file_bytes=4 * MiB,
            max_log_bytes=1 * MiB,
            max_log_file_bytes=0,
            max_open_files=4096,
            scratch_bytes=20 * GiB,
        ),
        # Agent jobs get the trl environment (trl, peft, accelerate, datasets), as PostTrainBench's do.
        agent_environment="trl",
        grader="posttrain_task_gsm8k.grader",
        integrity=IntegrityPolicy(
            identity=IDENTITY,
            contamination=CONTAMINATION,
            # Each dev evaluation grades a fresh sample of dev.
            dev_evaluations=DevEvaluationPolicy(
                max_calls=settings.dev_evaluations, sample_size=DEV_QUESTIONS
            ),
        ),
    )


PLUGIN = TaskPlugin(define=define, assets="posttrain_task_gsm8k.assets")
