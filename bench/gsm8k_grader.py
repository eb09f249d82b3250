"""The gsm8k grader's figures across CPU kernel sets and thread counts, on the stand-in.

    python bench/gsm8k_grader.py [--kernels default avx2 avx512] [--threads 1 2] [--workdir DIR]

Builds the stand-in (base model, splits), fine-tunes it once with `examples/train_gsm8k_sft.py` (trl's
SFTTrainer), then grades that one checkpoint on the hidden split with the real grader under every
kernel set torch offers (`ATEN_CPU_CAPABILITY`) and thread count. Prints one row per run: the score
(the seed mean), its interval, each seed's accuracy and a digest of the per-seed figures, and whether
every run agrees with the first.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from graders.result import read_result

REPO = Path(__file__).resolve().parents[1]
SFT_SCRIPT = REPO / "examples" / "train_gsm8k_sft.py"
STANDIN = {"POSTTRAIN_TASK_GSM8K_STANDIN": "true"}
GRADE = """
import sys
from posttrain_task_gsm8k import grader
grader.TORCH_THREADS = int(sys.argv[1])
from graders.run import main
sys.exit(main(["--task", "gsm8k", "--purpose", "score"]))
"""


def job_env(kernels: str, **extra: str) -> dict[str, str]:
    return {**os.environ, **STANDIN, "ATEN_CPU_CAPABILITY": kernels, "OMP_WAIT_POLICY": "PASSIVE", **extra}


def build_standin(workdir: Path) -> dict[str, Path]:
    """The stand-in's repos by split name ('base', 'train', 'hidden'), built by the task's own builders."""
    from posttrain_task_gsm8k import STANDIN_REPOS
    from posttrain_task_gsm8k.assets import BUILDERS

    repos = {}
    for role in ("base", "train", "hidden"):
        path = workdir / "repos" / role
        if not path.is_dir():
            path.mkdir(parents=True)
            BUILDERS[STANDIN_REPOS[role]](path, lambda _message: None)
        repos[role] = path
    return repos


def fine_tune(repos: dict[str, Path], workdir: Path) -> tuple[Path, float]:
    checkpoint = workdir / "checkpoint"
    started = time.monotonic()
    if not (checkpoint / "model.safetensors").exists():
        (workdir / "tmp").mkdir(exist_ok=True)
        env = job_env(
            "default",
            POSTTRAIN_INPUT_MODEL=str(repos["base"]),
            POSTTRAIN_INPUT_TRAIN=str(repos["train"]),
            POSTTRAIN_OUTPUT_DIR=str(checkpoint),
            TMPDIR=str(workdir / "tmp"),
        )
        subprocess.run([sys.executable, str(SFT_SCRIPT)], env=env, check=True, capture_output=True)
    return checkpoint, time.monotonic() - started


def grade(kernels: str, threads: int, repos: dict[str, Path], checkpoint: Path, out: Path) -> str:
    inputs = {"BASE_MODEL": repos["base"], "CHECKPOINT": checkpoint, "SPLIT": repos["hidden"]}
    env = job_env(
        kernels, POSTTRAIN_OUTPUT_DIR=str(out), **{f"POSTTRAIN_INPUT_{k}": str(v) for k, v in inputs.items()}
    )
    started = time.monotonic()
    subprocess.run([sys.executable, "-c", GRADE, str(threads)], env=env, check=True, capture_output=True)
    seconds = time.monotonic() - started
    result = read_result(out)
    assert result.status == "ok" and result.interval is not None, result
    per_seed = result.details["per_seed"]
    digest = hashlib.sha256(json.dumps([result.score, result.interval, per_seed]).encode()).hexdigest()[:10]
    low, high = result.interval
    seeds = " / ".join(f"{s:.2f}" for s in per_seed)
    figures = f"{result.score:.4f} | [{low:.3f}, {high:.3f}] | {seeds}"
    return f"| {kernels} | {threads} | {figures} | {seconds:.0f} | {digest} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kernels", nargs="+", default=["default", "avx2", "avx512"])
    parser.add_argument("--threads", nargs="+", type=int, default=[1, 2])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="gsm8k-bench-"))
    repos = build_standin(workdir)
    checkpoint, seconds = fine_tune(repos, workdir)
    print(f"stand-in fine-tuned in {seconds:.0f}s; checkpoint {checkpoint}", flush=True)
    print("| kernels | threads | score | 95% interval | per seed | grade s | digest |")
    print("|---|---|---|---|---|---|---|")
    digests = set()
    for kernels in args.kernels:
        for threads in args.threads:
            row = grade(kernels, threads, repos, checkpoint, workdir / f"grade-{kernels}-t{threads}")
            digests.add(row.rsplit("|", 2)[1].strip())
            print(row, flush=True)
    print(f"runs agreeing with each other: {'all' if len(digests) == 1 else f'no ({len(digests)} outcomes)'}")


if __name__ == "__main__":
    main()
