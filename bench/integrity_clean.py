"""The score job's integrity checks on clean fine-tunes: how many are flagged (the goal is none).

    python bench/integrity_clean.py [--gsm8k-seeds 0 1 ...] [--arithmetic-seeds 0 1 ...] [--workdir DIR]

For each seed, the task's own example recipe fine-tunes its base model (`examples/train_gsm8k_sft.py`
on the gsm8k stand-in, `examples/train_arithmetic_sft.py` on t0_arithmetic_format), the launcher's
own `copy_script` puts the script into the outputs as an agent job's would be, and the checks a score
job runs (`graders.integrity.checks.integrity_findings`, the task's policy, the hidden split, the
script's sha256 as the operator passes it) read the checkpoint. Prints one row per run with the
identity and contamination figures, then the number of runs with any finding. Grading itself is left
out: `bench/gsm8k_grader.py` and `bench/sft_recipe.py` measure it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from gsm8k_grader import build_standin  # bench/, this script's directory
from posttrain_launcher.launcher import copy_script
from posttrain_operator.api.provenance import script_sha256

from graders.assets import materialize_assets
from graders.inputs import GraderInputs
from graders.integrity import checks
from graders.integrity.checks import integrity_findings
from graders.tasks import Task, get_task

REPO = Path(__file__).resolve().parents[1]
# Before the registry is first read: the gsm8k task on its stand-in (a tiny model the project builds).
os.environ["POSTTRAIN_TASK_GSM8K_STANDIN"] = "true"
RECIPES = {"gsm8k": "train_gsm8k_sft.py", "t0_arithmetic_format": "train_arithmetic_sft.py"}


def repos_of(task: Task, workdir: Path) -> dict[str, Path]:
    """The task's base model, train and hidden repos, built by the project's own builders."""
    if task.name == "gsm8k":
        return build_standin(workdir / "gsm8k")
    build = [sys.executable, "-m", "graders.assets", "build", "--assets-dir", str(workdir / "assets")]
    subprocess.run(build, check=True, capture_output=True)
    repos = {str(repo.ref.repo_id): repo.path for repo in materialize_assets(workdir / "assets")}
    assert task.base_model is not None
    return {
        "base": repos[task.base_model.repo_id],
        "train": repos[task.agent_datasets["train"].repo_id],
        "hidden": repos[task.hidden_split.repo_id],
    }


def run_one(task: Task, repos: dict[str, Path], seed: int, workdir: Path) -> tuple[str, bool]:
    recipe = REPO / "examples" / RECIPES[task.name]
    outputs = workdir / f"{task.name}-s{seed}"
    (outputs / "tmp").mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_WAIT_POLICY": "PASSIVE",
        "SFT_SEED": str(seed),
        "POSTTRAIN_INPUT_MODEL": str(repos["base"]),
        "POSTTRAIN_INPUT_TRAIN": str(repos["train"]),
        "POSTTRAIN_OUTPUT_DIR": str(outputs / "checkpoint"),
        "TMPDIR": str(outputs / "tmp"),
    }
    started = time.monotonic()
    (outputs / "checkpoint").mkdir(exist_ok=True)
    script = recipe.read_text()
    copy_script(str(outputs / "checkpoint"), script)
    subprocess.run([sys.executable, str(recipe)], env=env, check=True, capture_output=True)
    trained = time.monotonic() - started
    inputs = GraderInputs(
        checkpoint=outputs / "checkpoint",
        split=repos["hidden"],
        base_model=repos["base"],
        scripts=((f"{task.name}-s{seed}", script_sha256(script)),),
    )
    started = time.monotonic()
    findings = integrity_findings(task, inputs)
    checked = time.monotonic() - started
    assert task.integrity.identity is not None and task.integrity.contamination is not None
    kinship = checks.identity_report(task.integrity.identity, inputs).figures()
    screened, _ = checks.contamination_report(task.integrity.contamination, inputs)
    verdicts = ", ".join(f"{f.check} {f.verdict}" for f in findings) or "clean"
    row = (
        f"| {task.name} | {seed} | {trained:.0f} | {kinship['kept_share']} | {kinship['median_cosine']} | "
        f"{kinship['relative_change']} | {screened.max_share:.2f} | {checked:.1f} | {verdicts} |"
    )
    return row, bool(findings)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gsm8k-seeds", nargs="*", type=int, default=list(range(12)))
    parser.add_argument("--arithmetic-seeds", nargs="*", type=int, default=list(range(8)))
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="integrity-bench-"))
    print(f"work dir {workdir}", flush=True)
    print(
        "| task | seed | train s | kept share | median cosine | relative change | max item share | checks s ",
        end="",
    )
    print("| findings |")
    print("|---|---|---|---|---|---|---|---|---|")
    flagged = runs = 0
    for name, seeds in (("gsm8k", args.gsm8k_seeds), ("t0_arithmetic_format", args.arithmetic_seeds)):
        if not seeds:
            continue
        task = get_task(name)
        repos = repos_of(task, workdir)
        for seed in seeds:
            row, found = run_one(task, repos, seed, workdir)
            print(row, flush=True)
            runs += 1
            flagged += found
    print(f"runs with a finding: {flagged} of {runs}")


if __name__ == "__main__":
    main()
