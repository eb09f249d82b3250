"""Hostile outputs fed to each grader through its real entry (`graders.run.run_grader`).

Every case is the agent's doing, so each must end `invalid_checkpoint` with score 0, never `error`
(which would turn the agent's failure into a platform failure with reward null). Each corpus has a
control that scores 1 (or ok), so a grader that refused everything would fail here too.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from graders.artifact import ANSWER_FILE, MAX_ANSWER_BYTES
from graders.assets.datasets import write_dataset_repo
from graders.checkpoint_files import MAX_TREE_DEPTH, MAX_TREE_ENTRIES, InvalidCheckpoint, agent_bytes
from graders.result import GraderResult
from graders.run import run_grader

CHECKS = [{"key": "k00", "expected": 7}, {"key": "k01", "expected": -3}]
RIGHT = {"k00": 7, "k01": -3}
WEIGHTS = "model.safetensors"

Writer = Callable[[Path], None]


def answer_text(text: str | bytes) -> Writer:
    def write(out: Path) -> None:
        data = text.encode() if isinstance(text, str) else text
        (out / ANSWER_FILE).write_bytes(data)

    return write


def right_answer_with(extra: Callable[[Path], None]) -> Writer:
    def write(out: Path) -> None:
        (out / ANSWER_FILE).write_text(json.dumps(RIGHT))
        extra(out)

    return write


def nested_dirs(depth: int) -> Callable[[Path], None]:
    def make(out: Path) -> None:
        path = out
        for _ in range(depth):
            path = path / "d"
        path.mkdir(parents=True)

    return make


def many_files(out: Path) -> None:
    (out / "many").mkdir()
    for index in range(MAX_TREE_ENTRIES + 1):
        (out / "many" / f"f{index}").touch()


def answer_is_a_fifo(out: Path) -> None:
    os.mkfifo(out / ANSWER_FILE)


def answer_is_a_dir(out: Path) -> None:
    (out / ANSWER_FILE).mkdir()


def answer_is_a_link(out: Path) -> None:
    (out.parent / "elsewhere.json").write_text(json.dumps(RIGHT))
    (out / ANSWER_FILE).symlink_to(out.parent / "elsewhere.json")


ARTIFACT_CORPUS: dict[str, Writer] = {
    "nested-arrays-200k": answer_text("[" * 200_000 + "]" * 200_000),
    "nested-objects-100k": answer_text('{"a":' * 100_000 + "1" + "}" * 100_000),
    "nested-in-a-value": answer_text('{"k00": ' + "[" * 150_000 + "]" * 150_000 + "}"),
    "integer-of-5000-digits": answer_text('{"k00": 1' + "0" * 5000 + "}"),
    "nan": answer_text('{"k00": NaN, "k01": -3}'),
    "infinity": answer_text('{"k00": Infinity, "k01": -3}'),
    "minus-infinity": answer_text('{"k00": -Infinity, "k01": -3}'),
    "not-utf8": answer_text(b'{"k00": 7, "k01": -3, "x": "\xff\xfe"}'),
    "utf16": answer_text(json.dumps(RIGHT).encode("utf-16")),
    "utf8-bom": answer_text(b"\xef\xbb\xbf" + json.dumps(RIGHT).encode()),
    "nul-bytes": answer_text(b"\x00" * 100),
    "empty": answer_text(b""),
    "larger-than-the-cap": answer_text(json.dumps(RIGHT) + " " * MAX_ANSWER_BYTES),
    "top-level-list": answer_text("[7, -3]"),
    "top-level-string": answer_text('"k00"'),
    "top-level-null": answer_text("null"),
    "answer-is-a-fifo": answer_is_a_fifo,
    "answer-is-a-directory": answer_is_a_dir,
    "answer-is-a-symlink": answer_is_a_link,
    "pickle-beside-the-answer": right_answer_with(lambda out: (out / "x.pkl").write_bytes(pickle.dumps(1))),
    "socket-beside-the-answer": right_answer_with(lambda out: os.mkfifo(out / "pipe")),
    "dirs-nested-too-deep": right_answer_with(nested_dirs(MAX_TREE_DEPTH + 5)),
    "too-many-entries": right_answer_with(many_files),
    "missing": lambda out: None,
}


@pytest.fixture
def artifact_env(tmp_path: Path) -> dict[str, str]:
    write_dataset_repo(tmp_path / "split", CHECKS)
    (tmp_path / "outputs").mkdir()
    return {
        "POSTTRAIN_INPUT_CHECKPOINT": str(tmp_path / "outputs"),
        "POSTTRAIN_INPUT_SPLIT": str(tmp_path / "split"),
    }


def assert_invalid(result: GraderResult) -> None:
    assert result.status == "invalid_checkpoint", result
    assert result.score == 0.0
    assert result.reason


def test_artifact_control_scores_one(artifact_env: dict[str, str]) -> None:
    out = Path(artifact_env["POSTTRAIN_INPUT_CHECKPOINT"])
    right_answer_with(lambda out: (out / "notes.txt").write_text("fine"))(out)
    result = run_grader("t0_artifact", artifact_env)
    assert (result.status, result.score) == ("ok", 1.0)


@pytest.mark.parametrize("case", sorted(ARTIFACT_CORPUS))
def test_artifact_hostile_answer_is_invalid_never_an_error(artifact_env: dict[str, str], case: str) -> None:
    ARTIFACT_CORPUS[case](Path(artifact_env["POSTTRAIN_INPUT_CHECKPOINT"]))
    assert_invalid(run_grader("t0_artifact", artifact_env))


@pytest.mark.parametrize(
    "answer", [{"k00": "7", "k01": -3}, {"k00": 7.0, "k01": -3}, {"k00": True, "k01": -3}, {"\ud800": 1}]
)
def test_artifact_wrong_but_well_formed_answers_score_zero(
    artifact_env: dict[str, str], answer: dict[str, object]
) -> None:
    out = Path(artifact_env["POSTTRAIN_INPUT_CHECKPOINT"])
    (out / ANSWER_FILE).write_text(json.dumps(answer))
    result = run_grader("t0_artifact", artifact_env)
    assert (result.status, result.score) == ("ok", 0.0)


def test_artifact_missing_split_is_the_platforms_error(artifact_env: dict[str, str]) -> None:
    """The control for the line: what the platform failed to provide is `error`, not invalid."""
    answer_text(json.dumps(RIGHT))(Path(artifact_env["POSTTRAIN_INPUT_CHECKPOINT"]))
    env = {**artifact_env, "POSTTRAIN_INPUT_SPLIT": artifact_env["POSTTRAIN_INPUT_SPLIT"] + "-missing"}
    assert run_grader("t0_artifact", env).status == "error"


def test_artifact_missing_checkpoint_mount_is_the_platforms_error(artifact_env: dict[str, str]) -> None:
    env = {**artifact_env, "POSTTRAIN_INPUT_CHECKPOINT": artifact_env["POSTTRAIN_INPUT_CHECKPOINT"] + "-gone"}
    assert run_grader("t0_artifact", env).status == "error"


# -- t0_arithmetic_format ---------------------------------------------------------------------------


def raw_safetensors(header: bytes, data: bytes = b"", length: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if length is None else length) + header + data


def with_tensors(change: Callable[[dict[str, torch.Tensor]], dict[str, torch.Tensor]]) -> Callable[..., None]:
    def write(out: Path, base: dict[str, torch.Tensor]) -> None:
        save_file({k: v.contiguous() for k, v in change(dict(base)).items()}, out / WEIGHTS)

    return write


def raw_file(data: bytes, name: str = WEIGHTS) -> Callable[..., None]:
    def write(out: Path, base: dict[str, torch.Tensor]) -> None:
        (out / name).write_bytes(data)

    return write


def first(base: dict[str, torch.Tensor]) -> str:
    return sorted(base)[0]


def valid_bytes(base: dict[str, torch.Tensor]) -> bytes:
    from safetensors.torch import save

    return save({k: v.contiguous() for k, v in base.items()})


def truncated(out: Path, base: dict[str, torch.Tensor]) -> None:
    (out / WEIGHTS).write_bytes(valid_bytes(base)[:-100])


def offsets_out_of_range(out: Path, base: dict[str, torch.Tensor]) -> None:
    name = first(base)
    shape = list(base[name].shape)
    header = json.dumps({name: {"dtype": "F32", "shape": shape, "data_offsets": [0, 10**12]}}).encode()
    (out / WEIGHTS).write_bytes(raw_safetensors(header, b"\x00" * 64))


def split_with_a_duplicate(out: Path, base: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in base.items()}, out / "a.safetensors")
    name = first(base)
    save_file({name: base[name].contiguous()}, out / "b.safetensors")


def everything_twice_too_big(out: Path, base: dict[str, torch.Tensor]) -> None:
    save_file({k: v.contiguous() for k, v in base.items()}, out / WEIGHTS)
    (out / "padding.safetensors").write_bytes(raw_safetensors(b"{}", b"\x00" * (8 << 20)))


def weights_are_a_fifo(out: Path, base: dict[str, torch.Tensor]) -> None:
    os.mkfifo(out / WEIGHTS)


def weights_are_a_directory(out: Path, base: dict[str, torch.Tensor]) -> None:
    (out / WEIGHTS).mkdir()


def weights_are_a_link(out: Path, base: dict[str, torch.Tensor]) -> None:
    (out.parent / "elsewhere.safetensors").write_bytes(valid_bytes(base))
    (out / WEIGHTS).symlink_to(out.parent / "elsewhere.safetensors")


def pickle_beside(out: Path, base: dict[str, torch.Tensor]) -> None:
    (out / WEIGHTS).write_bytes(valid_bytes(base))
    (out / "pytorch_model.bin").write_bytes(pickle.dumps({"x": 1}))


def nan_in(change_value: float) -> Callable[..., None]:
    def change(base: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        name = first(base)
        tensor = base[name].clone()
        tensor.view(-1)[0] = change_value
        return {**base, name: tensor}

    return with_tensors(change)


ARITHMETIC_CORPUS: dict[str, Callable[..., None]] = {
    "zero-bytes": raw_file(b""),
    "garbage": raw_file(os.urandom(4096)),
    "header-length-2**63": raw_file(raw_safetensors(b"{}", length=(1 << 63) - 1)),
    "header-length-past-the-end": raw_file(raw_safetensors(b"{}", length=1 << 20)),
    "header-not-json": raw_file(raw_safetensors(b"{not json")),
    "header-nested-100k": raw_file(raw_safetensors(b"[" * 100_000 + b"]" * 100_000)),
    "header-a-list": raw_file(raw_safetensors(b"[1, 2]")),
    "header-not-utf8": raw_file(raw_safetensors(b'{"\xff": 1}')),
    "metadata-not-strings": raw_file(raw_safetensors(b'{"__metadata__": {"a": [1, 2]}}')),
    "truncated-data": truncated,
    "offsets-out-of-range": offsets_out_of_range,
    "integer-dtype": with_tensors(lambda b: {**b, first(b): b[first(b)].to(torch.int64)}),
    "bool-dtype": with_tensors(lambda b: {**b, first(b): b[first(b)] > 0}),
    "nan-value": nan_in(float("nan")),
    "inf-value": nan_in(float("inf")),
    "shape-mismatch": with_tensors(lambda b: {**b, first(b): torch.zeros(3, 3)}),
    "scalar-for-a-matrix": with_tensors(lambda b: {**b, first(b): torch.tensor(1.0)}),
    "extra-tensor": with_tensors(lambda b: {**b, "score: 1.0": torch.ones(1)}),
    "missing-tensor": with_tensors(lambda b: {k: v for k, v in b.items() if k != first(b)}),
    "tensor-in-two-files": split_with_a_duplicate,
    "too-big": everything_twice_too_big,
    "weights-are-a-fifo": weights_are_a_fifo,
    "weights-are-a-directory": weights_are_a_directory,
    "weights-are-a-symlink": weights_are_a_link,
    "pickle-beside-the-weights": pickle_beside,
    "no-weights": raw_file(b"{}", name="config.json"),
}


@pytest.fixture
def arithmetic_env(tmp_path: Path, base_dir: Path) -> dict[str, str]:
    write_dataset_repo(tmp_path / "split", [{"prompt": "Q: 1+2\nA:", "answer": "3"}])
    (tmp_path / "outputs").mkdir()
    return {
        "POSTTRAIN_INPUT_CHECKPOINT": str(tmp_path / "outputs"),
        "POSTTRAIN_INPUT_SPLIT": str(tmp_path / "split"),
        "POSTTRAIN_INPUT_BASE_MODEL": str(base_dir),
    }


def test_arithmetic_control_grades_the_base_weights(
    arithmetic_env: dict[str, str], base_tensors: dict[str, torch.Tensor]
) -> None:
    (Path(arithmetic_env["POSTTRAIN_INPUT_CHECKPOINT"]) / WEIGHTS).write_bytes(valid_bytes(base_tensors))
    result = run_grader("t0_arithmetic_format", arithmetic_env)
    assert (result.status, result.n) == ("ok", 1)


@pytest.mark.parametrize("case", sorted(ARITHMETIC_CORPUS))
def test_arithmetic_hostile_checkpoint_is_invalid_never_an_error(
    arithmetic_env: dict[str, str], base_tensors: dict[str, torch.Tensor], case: str
) -> None:
    ARITHMETIC_CORPUS[case](Path(arithmetic_env["POSTTRAIN_INPUT_CHECKPOINT"]), base_tensors)
    assert_invalid(run_grader("t0_arithmetic_format", arithmetic_env))


def test_arithmetic_missing_base_model_is_the_platforms_error(
    arithmetic_env: dict[str, str], base_tensors: dict[str, torch.Tensor]
) -> None:
    (Path(arithmetic_env["POSTTRAIN_INPUT_CHECKPOINT"]) / WEIGHTS).write_bytes(valid_bytes(base_tensors))
    env = {**arithmetic_env, "POSTTRAIN_INPUT_BASE_MODEL": arithmetic_env["POSTTRAIN_INPUT_SPLIT"]}
    assert run_grader("t0_arithmetic_format", env).status == "error"


# -- where the line runs ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "raised",
    [
        RecursionError("maximum recursion depth"),
        ValueError("digits"),
        UnicodeDecodeError("utf-8", b"", 0, 1, "x"),
    ],
    ids=["recursion", "value", "unicode"],
)
def test_anything_raised_while_reading_agent_bytes_is_an_invalid_checkpoint(raised: Exception) -> None:
    with pytest.raises(InvalidCheckpoint, match=type(raised).__name__), agent_bytes("answer.json"):
        raise raised


def test_the_graders_own_memory_running_out_is_not_the_agents_fault() -> None:
    """MemoryError passes through, so `run_grader` reports it as the platform's `error`."""
    with pytest.raises(MemoryError), agent_bytes("answer.json cannot be read"):
        raise MemoryError
