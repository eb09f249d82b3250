"""Grader job entry: `python -m graders.run --task NAME` (role `grader` under the launcher).

Inputs come from POSTTRAIN_INPUT_CHECKPOINT, POSTTRAIN_INPUT_SPLIT and, for tasks with a base model,
POSTTRAIN_INPUT_BASE_MODEL; the result goes to $POSTTRAIN_OUTPUT_DIR/result.json. The score is written
only there: logs are agent-visible and forgeable, so they carry the status and never the score.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import os
import random
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Protocol, get_args

from graders.inputs import OUTPUT_DIR_ENV, GraderInputs
from graders.result import GraderResult, write_result
from graders.tasks import DATASET_FILE, GraderPurpose, Task, get_task

RUNNER_VERSION = "run/1"
EXIT_OK = 0
EXIT_GRADER_ERROR = 1
EXIT_USAGE = 2


class GraderModule(Protocol):
    GRADER_VERSION: str

    def grade(self, task: Task, inputs: GraderInputs) -> GraderResult: ...


def _log(message: str) -> None:
    sys.stderr.write(f"posttrain-grader: {message}\n")


def run_grader(
    task_name: str,
    env: Mapping[str, str],
    purpose: GraderPurpose = "score",
    sample_seed: int | None = None,
    scripts: Sequence[tuple[str, str]] = (),
) -> GraderResult:
    """Grade per the task, then (a score job) run its integrity checks; any failure of the platform's
    side becomes status `error`, not an exception. `sample_seed` grades a dev evaluation on a fresh
    subsample of dev, where the task asks for one; `scripts` are the (job, sha256) of the scripts the
    submission was built by, its own job's first."""
    try:
        task = get_task(task_name)
        inputs = GraderInputs.from_env(env, needs_base_model=task.base_model is not None, purpose=purpose)
        inputs = dataclasses.replace(inputs, scripts=tuple(scripts))
        module: GraderModule = importlib.import_module(task.grader)
        sample_size = task.integrity.dev_evaluations.sample_size
        if purpose != "devEval" or sample_size is None or sample_seed is None:
            return _checked(task, inputs, module.grade(task, inputs))
        with tempfile.TemporaryDirectory(prefix="posttrain-dev-sample-") as scratch:
            split = subsample_split(inputs.split, Path(scratch), sample_size, sample_seed)
            return module.grade(task, dataclasses.replace(inputs, split=split))
    except Exception as exc:
        return GraderResult.error(f"{type(exc).__name__}: {exc}", RUNNER_VERSION)


def _checked(task: Task, inputs: GraderInputs, result: GraderResult) -> GraderResult:
    """A score job's result with its integrity findings (a checkpoint that did not grade has none)."""
    if inputs.purpose != "score" or result.status != "ok":
        return result
    from graders.integrity.checks import integrity_findings  # torch: imported in the job only

    return result.model_copy(update={"findings": integrity_findings(task, inputs)})


def subsample_split(split: Path, scratch: Path, size: int, seed: int) -> Path:
    """A copy of the split with `size` of its records, drawn by `seed`, in their order (all of them
    when it has no more)."""
    records = (split / DATASET_FILE).read_text(encoding="utf-8").splitlines(keepends=True)
    records = [line for line in records if line.strip()]
    if len(records) > size:
        chosen = sorted(random.Random(seed).sample(range(len(records)), size))
        records = [records[index] for index in chosen]
    (scratch / DATASET_FILE).write_text("".join(records), encoding="utf-8")
    return scratch


def _job_script(value: str) -> tuple[str, str]:
    job, _, sha256 = value.partition("=")
    if not job or len(sha256) != 64:
        raise argparse.ArgumentTypeError(f"expected JOB=SHA256, got {value!r}")
    return job, sha256


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graders.run")
    parser.add_argument("--task", required=True)
    parser.add_argument("--purpose", choices=get_args(GraderPurpose), default="score")
    parser.add_argument("--sample-seed", type=int, default=None)
    parser.add_argument("--script", type=_job_script, action="append", default=[], metavar="JOB=SHA256")
    args = parser.parse_args(argv)
    output_dir = os.environ.get(OUTPUT_DIR_ENV)
    if not output_dir:
        _log(f"error: {OUTPUT_DIR_ENV} is not set")
        return EXIT_USAGE
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # graders never fetch: every input is mounted
    # Before torch loads (the grader module imports it): spinning OpenMP threads starve each other
    # on a shared CPU; passive waiting measured 3-5x faster on a busy 2-core machine.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

    result = run_grader(args.task, os.environ, args.purpose, args.sample_seed, args.script)
    write_result(Path(output_dir), result)
    _log(f"task {args.task}: status {result.status}, n {result.n}, result written")
    if result.status == "error":
        _log(f"error: {result.reason}")
        return EXIT_GRADER_ERROR
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
