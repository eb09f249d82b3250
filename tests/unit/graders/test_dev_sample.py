"""A task that answers each dev evaluation on a fresh sample of dev: the runner draws it."""

from __future__ import annotations

import json
from pathlib import Path

from graders.run import subsample_split
from graders.tasks import DATASET_FILE, get_task


def _split(tmp_path: Path, n: int) -> Path:
    split = tmp_path / "split"
    split.mkdir()
    lines = [json.dumps({"question": f"q{i}", "answer": str(i)}) + "\n" for i in range(n)]
    (split / DATASET_FILE).write_text("".join(lines) + "\n", encoding="utf-8")
    return split


def _answers(split: Path) -> list[int]:
    lines = (split / DATASET_FILE).read_text(encoding="utf-8").splitlines()
    return [int(json.loads(line)["answer"]) for line in lines if line.strip()]


def test_a_sample_is_drawn_by_its_seed_in_the_split_order(tmp_path: Path) -> None:
    split = _split(tmp_path, 500)
    samples = {}
    for seed in (1, 2, 1):
        scratch = tmp_path / f"s{seed}-{len(samples)}"
        scratch.mkdir()
        samples.setdefault(seed, []).append(_answers(subsample_split(split, scratch, 200, seed)))
    first, again = samples[1]
    assert first == again  # the same job (its seed) grades the same sample
    assert len(first) == 200 == len(set(first)) and first == sorted(first)
    assert samples[2][0] != first  # another evaluation, another sample
    assert _answers(split) == list(range(500))  # the mounted split is untouched


def test_a_split_no_larger_than_the_sample_is_graded_whole(tmp_path: Path) -> None:
    split = _split(tmp_path, 50)
    scratch = tmp_path / "s"
    scratch.mkdir()
    assert _answers(subsample_split(split, scratch, 200, 9)) == list(range(50))


def test_task_info_states_the_dev_evaluation_rule() -> None:
    view = get_task("gsm8k").public_view().model_dump(mode="json")
    assert view["integrity"]["dev_evaluations"] == {"max_calls": 20, "sample_size": 200}
    assert view["integrity"]["contamination"]["action"] == "withhold"
