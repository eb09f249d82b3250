"""The graders end to end on the real local assets: grader and training run as job processes would.

No cluster: each job is a subprocess with the launcher's env contract (POSTTRAIN_INPUT_<NAME>,
POSTTRAIN_OUTPUT_DIR). The assets are built once into the user cache and reused.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from graders.assets import LocalRepo, materialize_assets
from graders.result import GraderResult, read_result
from graders.tasks import DATASET_FILE, RepoRef, get_task

REPO_ROOT = Path(__file__).resolve().parents[3]
SFT_SCRIPT = REPO_ROOT / "examples" / "train_arithmetic_sft.py"
ARITHMETIC = get_task("t0_arithmetic_format")
ARTIFACT = get_task("t0_artifact")


@pytest.fixture(scope="session")
def repos() -> dict[RepoRef, Path]:
    local: list[LocalRepo] = materialize_assets(progress=lambda message: print(message, flush=True))
    return {repo.ref: repo.path for repo in local}


def run_job(
    args: list[str], inputs: dict[str, Path], output_dir: Path, timeout: float = 900
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "POSTTRAIN_OUTPUT_DIR": str(output_dir),
        **{f"POSTTRAIN_INPUT_{name.upper()}": str(path) for name, path in inputs.items()},
    }
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=REPO_ROOT, capture_output=True, text=True, timeout=timeout
    )


def grade(task_name: str, inputs: dict[str, Path], output_dir: Path) -> GraderResult:
    proc = run_job(["-m", "graders.run", "--task", task_name], inputs, output_dir)
    assert proc.returncode == 0, proc.stderr
    assert "score" not in (proc.stdout + proc.stderr).lower()
    return read_result(output_dir)


def grade_arithmetic(repos: dict[RepoRef, Path], checkpoint: Path, split: RepoRef, out: Path) -> GraderResult:
    assert ARITHMETIC.base_model is not None
    inputs = {"base_model": repos[ARITHMETIC.base_model], "checkpoint": checkpoint, "split": repos[split]}
    return grade(ARITHMETIC.name, inputs, out)


def test_assets_are_cached_after_the_first_build(repos: dict[RepoRef, Path]) -> None:
    assert ARITHMETIC.base_model is not None
    weights = repos[ARITHMETIC.base_model] / "model.safetensors"
    built_at = weights.stat().st_mtime_ns
    again = {repo.ref: repo.path for repo in materialize_assets()}
    assert again == repos
    assert weights.stat().st_mtime_ns == built_at


def test_base_knows_every_sum_by_its_margin_after_a_reload(repos: dict[RepoRef, Path]) -> None:
    """What makes the fine-tunes alike on every machine: the base's knowledge, not its weights."""
    import torch
    from transformers import AutoModelForCausalLM

    from graders.assets.tiny_model import (
        PRETRAIN_MARGIN,
        all_sums,
        answer_only_batch,
        build_tokenizer,
        smallest_lead,
    )

    assert ARITHMETIC.base_model is not None
    model = AutoModelForCausalLM.from_pretrained(repos[ARITHMETIC.base_model], dtype=torch.float32)
    model.train(False)
    assert smallest_lead(model, answer_only_batch(build_tokenizer(), all_sums())) >= PRETRAIN_MARGIN


def test_untrained_base_scores_at_most_0_1_on_the_hidden_split(
    repos: dict[RepoRef, Path], tmp_path: Path
) -> None:
    assert ARITHMETIC.base_model is not None
    result = grade_arithmetic(repos, repos[ARITHMETIC.base_model], ARITHMETIC.hidden_split, tmp_path / "out")
    assert result.status == "ok"
    assert result.n == 100
    assert result.score <= 0.1


@pytest.mark.slow
@pytest.mark.timeout(3600)  # about 5 minutes on 2 idle cores; a busy machine can take several times that
def test_one_sft_job_reaches_0_95_on_dev_and_hidden(repos: dict[RepoRef, Path], tmp_path: Path) -> None:
    assert ARITHMETIC.base_model is not None
    checkpoint = tmp_path / "sft-outputs"
    started = time.monotonic()
    train = run_job(
        [str(SFT_SCRIPT)],
        {"model": repos[ARITHMETIC.base_model], "train": repos[ARITHMETIC.agent_datasets["train"]]},
        checkpoint,
        timeout=3000,
    )
    print(f"SFT job took {time.monotonic() - started:.0f}s")
    assert train.returncode == 0, train.stderr[-2000:]
    print(train.stdout[-600:])  # the steps it took to the margin (or the cap it hit), when this fails

    dev = grade_arithmetic(repos, checkpoint, ARITHMETIC.dev_split, tmp_path / "dev")
    hidden = grade_arithmetic(repos, checkpoint, ARITHMETIC.hidden_split, tmp_path / "hidden")
    print(f"dev {dev.score} {dev.details}, hidden {hidden.score} {hidden.details}")
    assert (dev.status, hidden.status) == ("ok", "ok")
    assert dev.score >= 0.95
    assert hidden.score >= 0.95


def artifact_answer(records_dir: Path) -> dict[str, int]:
    sums: dict[str, int] = {}
    for line in (records_dir / DATASET_FILE).read_text().splitlines():
        record = json.loads(line)
        sums[record["key"]] = sums.get(record["key"], 0) + record["value"]
    return sums


def grade_artifact(
    repos: dict[RepoRef, Path], answer: object, split: RepoRef, tmp_path: Path
) -> GraderResult:
    outputs = tmp_path / "job-outputs"
    outputs.mkdir()
    (outputs / "answer.json").write_text(json.dumps(answer))
    return grade(ARTIFACT.name, {"checkpoint": outputs, "split": repos[split]}, tmp_path / "grader")


@pytest.mark.parametrize("split_name", ["dev", "hidden"])
def test_artifact_scores_one_when_right(repos: dict[RepoRef, Path], tmp_path: Path, split_name: str) -> None:
    answer = artifact_answer(repos[ARTIFACT.agent_datasets["records"]])
    result = grade_artifact(
        repos, answer, ARTIFACT.grader_split("score" if split_name == "hidden" else "devEval"), tmp_path
    )
    assert (result.status, result.score) == ("ok", 1.0)


def test_artifact_scores_zero_when_wrong(repos: dict[RepoRef, Path], tmp_path: Path) -> None:
    answer = artifact_answer(repos[ARTIFACT.agent_datasets["records"]])
    off_by_one = {
        key: value + (1 if index == 0 else 0) for index, (key, value) in enumerate(sorted(answer.items()))
    }
    result = grade_artifact(repos, off_by_one, ARTIFACT.hidden_split, tmp_path)
    assert (result.status, result.score) == ("ok", 0.0)
    assert result.details == {"matched_keys": len(answer) - 1}
