"""The t0_arithmetic_format recipe across CPU kernel sets, seeds and thread counts.

    python bench/sft_recipe.py [--kernels default avx2 avx512] [--seeds 0 1 2 3 4] [--threads 1 2]
                               [--parallel 2] [--workdir DIR]

For each kernel set torch offers (`ATEN_CPU_CAPABILITY`), the base model is built under that kernel
set (its weights depend on it; their sha256 is printed), then `examples/train_arithmetic_sft.py` runs
for every seed and thread count, and the real grader scores the checkpoint on the dev and hidden
splits. Prints one row per run and the minimum reward. Runs of one thread go `--parallel` at a time.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from graders.assets import materialize_assets
from graders.result import read_result
from graders.tasks import get_task

REPO = Path(__file__).resolve().parents[1]
SFT_SCRIPT = REPO / "examples" / "train_arithmetic_sft.py"
TASK = get_task("t0_arithmetic_format")


@dataclass(frozen=True)
class Run:
    kernels: str
    seed: int
    threads: int


def job_env(kernels: str, **extra: str) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ATEN_CPU_CAPABILITY": kernels,
        "OMP_WAIT_POLICY": "PASSIVE",
        **extra,
    }


def build_base(kernels: str, assets_dir: Path) -> dict[str, Path]:
    """Every task repo, with the base model built under `kernels` (in a subprocess, so the setting holds)."""
    build = [sys.executable, "-m", "graders.assets", "build", "--assets-dir", str(assets_dir)]
    subprocess.run(build, env=job_env(kernels), check=True, capture_output=True)
    return {str(repo.ref.repo_id): repo.path for repo in materialize_assets(assets_dir)}


def weights_digest(model_dir: Path) -> str:
    return hashlib.sha256((model_dir / "model.safetensors").read_bytes()).hexdigest()[:12]


def grade(kernels: str, repos: dict[str, Path], checkpoint: Path, split: str, out: Path) -> float:
    assert TASK.base_model is not None
    inputs = {"BASE_MODEL": repos[TASK.base_model.repo_id], "CHECKPOINT": checkpoint, "SPLIT": repos[split]}
    env = job_env(
        kernels, POSTTRAIN_OUTPUT_DIR=str(out), **{f"POSTTRAIN_INPUT_{k}": str(v) for k, v in inputs.items()}
    )
    subprocess.run(
        [sys.executable, "-m", "graders.run", "--task", TASK.name], env=env, check=True, capture_output=True
    )
    result = read_result(out)
    assert result.status == "ok", result
    return result.score


def run_one(run: Run, repos: dict[str, Path], workdir: Path) -> str:
    assert TASK.base_model is not None
    root = workdir / f"{run.kernels}-s{run.seed}-t{run.threads}"
    started = time.monotonic()
    inputs = {"MODEL": repos[TASK.base_model.repo_id], "TRAIN": repos[TASK.agent_datasets["train"].repo_id]}
    env = job_env(
        run.kernels,
        SFT_SEED=str(run.seed),
        SFT_THREADS=str(run.threads),
        POSTTRAIN_OUTPUT_DIR=str(root / "checkpoint"),
        **{f"POSTTRAIN_INPUT_{k}": str(v) for k, v in inputs.items()},
    )
    train = subprocess.run(
        [sys.executable, str(SFT_SCRIPT)], env=env, check=True, capture_output=True, text=True
    )
    seconds = time.monotonic() - started
    last = [line for line in train.stdout.splitlines() if line.startswith("step ")][-1]
    steps = last.split()[1]
    dev = grade(run.kernels, repos, root / "checkpoint", TASK.dev_split.repo_id, root / "dev")
    hidden = grade(run.kernels, repos, root / "checkpoint", TASK.hidden_split.repo_id, root / "hidden")
    return (
        f"| {run.kernels} | {run.seed} | {run.threads} | {steps} | {seconds:.0f} | {dev:.2f} | {hidden:.2f} |"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["default", "avx2", "avx512"])
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2, 3, 4])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--parallel", type=int, default=2, help="runs at once")
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="sft-recipe-"))
    print(f"work dir {workdir}", flush=True)
    assert TASK.base_model is not None
    bases = {kernels: build_base(kernels, workdir / f"assets-{kernels}") for kernels in args.kernels}
    for kernels, repos in bases.items():
        digest = weights_digest(repos[TASK.base_model.repo_id])
        print(f"base model built under {kernels}: sha256 {digest}", flush=True)
    print("| kernels | seed | threads | steps | train s | dev | hidden |", flush=True)
    print("|---|---|---|---|---|---|---|", flush=True)
    # Seed-major, so an interrupted run still covers every kernel set and thread count.
    runs = [Run(k, seed, t) for seed in args.seeds for k in args.kernels for t in args.threads]
    rows: list[str] = []
    with ThreadPoolExecutor(args.parallel) as pool:
        for row in pool.map(lambda run: run_one(run, bases[run.kernels], workdir), runs):
            print(row, flush=True)
            rows.append(row)
    rewards = [float(cell) for row in rows for cell in row.strip("|").split("|")[-2:]]
    print(f"minimum reward over {len(rows)} runs: {min(rewards):.2f}")


if __name__ == "__main__":
    main()
