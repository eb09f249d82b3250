"""Strict checkpoint loading: anything but the base model's exact tensors, in safetensors, is refused."""

import json
import os
import pickle
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from graders.assets.datasets import write_dataset_repo
from graders.checkpoint import load_strict
from graders.checkpoint_files import InvalidCheckpoint
from graders.result import read_result
from graders.run import main

WEIGHTS = "model.safetensors"


def write_checkpoint(directory: Path, tensors: dict[str, torch.Tensor]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({name: tensor.contiguous() for name, tensor in tensors.items()}, directory / WEIGHTS)
    return directory


def test_valid_checkpoint_weights_replace_the_base_weights(
    base_dir: Path, base_tensors, tmp_path: Path
) -> None:
    changed = {name: torch.full_like(tensor, 0.25) for name, tensor in base_tensors.items()}
    checkpoint = write_checkpoint(tmp_path / "ckpt", changed)
    # Files other than weights (config, notes) are allowed and never read.
    (checkpoint / "config.json").write_text(
        json.dumps({"model_type": "gpt2", "auto_map": {"x": "evil.Model"}})
    )
    model, tokenizer = load_strict(base_dir, checkpoint)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert tokenizer.eos_token == "</s>"
    for name, tensor in model.state_dict().items():
        assert torch.all(tensor == 0.25), name


def test_extra_tensor_named_like_a_score_line_is_rejected(
    base_dir: Path, base_tensors, tmp_path: Path
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", {**base_tensors, "score: 1.0": torch.ones(1)})
    with pytest.raises(InvalidCheckpoint, match=re.escape("unexpected tensors: 'score: 1.0'")):
        load_strict(base_dir, checkpoint)


def test_missing_tensor_is_rejected(base_dir: Path, base_tensors, tmp_path: Path) -> None:
    dropped = "model.layers.0.mlp.down_proj.weight"
    tensors = {name: tensor for name, tensor in base_tensors.items() if name != dropped}
    with pytest.raises(InvalidCheckpoint, match=f"missing tensors: '{dropped}'"):
        load_strict(base_dir, write_checkpoint(tmp_path / "ckpt", tensors))


def test_shape_mismatch_is_rejected(base_dir: Path, base_tensors, tmp_path: Path) -> None:
    name = "model.embed_tokens.weight"
    rows, width = base_tensors[name].shape
    tensors = {**base_tensors, name: torch.zeros(rows + 1, width)}
    with pytest.raises(InvalidCheckpoint, match=f"{name}.* has shape \\[{rows + 1}, {width}\\]"):
        load_strict(base_dir, write_checkpoint(tmp_path / "ckpt", tensors))


def test_integer_tensor_is_rejected(base_dir: Path, base_tensors, tmp_path: Path) -> None:
    name = "model.norm.weight"
    tensors = {**base_tensors, name: torch.ones_like(base_tensors[name], dtype=torch.int32)}
    with pytest.raises(InvalidCheckpoint, match="dtype I32"):
        load_strict(base_dir, write_checkpoint(tmp_path / "ckpt", tensors))


@pytest.mark.parametrize(
    "pickle_name", ["pytorch_model.bin", "training_args.bin", "sub/optimizer.pt", "x.pkl"]
)
def test_pickle_file_is_rejected_even_beside_valid_weights(
    base_dir: Path, base_tensors, tmp_path: Path, pickle_name: str
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", base_tensors)
    (checkpoint / pickle_name).parent.mkdir(parents=True, exist_ok=True)
    (checkpoint / pickle_name).write_bytes(pickle.dumps({"score": 1.0}))
    with pytest.raises(InvalidCheckpoint, match="pickle-format file"):
        load_strict(base_dir, checkpoint)


def test_symlink_out_of_the_checkpoint_dir_is_rejected(base_dir: Path, base_tensors, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    # The link points at perfectly valid weights: where they live is what makes it invalid.
    os.symlink(base_dir / WEIGHTS, checkpoint / WEIGHTS)
    with pytest.raises(InvalidCheckpoint, match="symlink"):
        load_strict(base_dir, checkpoint)


def test_any_symlink_is_rejected(base_dir: Path, base_tensors, tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", base_tensors)
    (checkpoint / "sub").mkdir()
    os.symlink("/", checkpoint / "sub" / "root")
    with pytest.raises(InvalidCheckpoint, match="symlink in the checkpoint: 'sub/root'"):
        load_strict(base_dir, checkpoint)


def test_no_safetensors_is_rejected(base_dir: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    (checkpoint / "nested").mkdir(parents=True)
    (checkpoint / "README.md").write_text("weights are elsewhere")
    with pytest.raises(InvalidCheckpoint, match=re.escape("no *.safetensors")):
        load_strict(base_dir, checkpoint)


def test_garbage_safetensors_file_is_rejected(base_dir: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "ckpt"
    checkpoint.mkdir()
    (checkpoint / WEIGHTS).write_bytes(b"\xff" * 64)
    with pytest.raises(InvalidCheckpoint, match="not a valid safetensors file"):
        load_strict(base_dir, checkpoint)


def test_fifo_is_rejected_without_blocking(base_dir: Path, base_tensors, tmp_path: Path) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", base_tensors)
    os.mkfifo(checkpoint / "extra.safetensors")
    with pytest.raises(InvalidCheckpoint, match="not a regular file"):
        load_strict(base_dir, checkpoint)


def grader_env(base_dir: Path, checkpoint: Path, split: Path, output: Path) -> dict[str, str]:
    return {
        "POSTTRAIN_INPUT_BASE_MODEL": str(base_dir),
        "POSTTRAIN_INPUT_CHECKPOINT": str(checkpoint),
        "POSTTRAIN_INPUT_SPLIT": str(split),
        "POSTTRAIN_OUTPUT_DIR": str(output),
    }


@pytest.fixture
def split_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "split"
    write_dataset_repo(
        directory, [{"prompt": "Q: 1+2\nA:", "answer": "3"}, {"prompt": "Q: 10+2\nA:", "answer": "12"}]
    )
    return directory


def test_grader_entry_writes_invalid_checkpoint_result_with_zero_score(
    base_dir: Path, base_tensors, split_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", {**base_tensors, "score: 1.0": torch.ones(1)})
    for name, value in grader_env(base_dir, checkpoint, split_dir, tmp_path / "out").items():
        monkeypatch.setenv(name, value)
    assert main(["--task", "t0_arithmetic_format"]) == 0
    result = read_result(tmp_path / "out")
    assert (result.status, result.score, result.n) == ("invalid_checkpoint", 0.0, 0)
    assert result.reason is not None
    assert "score: 1.0" in result.reason


def test_grader_entry_scores_a_valid_checkpoint_without_logging_the_score(
    base_dir: Path,
    base_tensors,
    split_dir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capfd: pytest.CaptureFixture[str],
) -> None:
    checkpoint = write_checkpoint(tmp_path / "ckpt", base_tensors)
    for name, value in grader_env(base_dir, checkpoint, split_dir, tmp_path / "out").items():
        monkeypatch.setenv(name, value)
    assert main(["--task", "t0_arithmetic_format"]) == 0
    result = read_result(tmp_path / "out")
    assert (result.status, result.n) == ("ok", 2)
    assert 0 <= result.details["correct"] <= result.details["well_formatted"] + result.n
    logs = capfd.readouterr()
    assert "score" not in (logs.out + logs.err).lower()
    assert "result written" in logs.err


def test_grader_entry_reports_platform_errors_as_error_status(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTTRAIN_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.delenv("POSTTRAIN_INPUT_SPLIT", raising=False)
    monkeypatch.setenv("POSTTRAIN_INPUT_CHECKPOINT", str(tmp_path))
    assert main(["--task", "t0_artifact"]) == 1
    result = read_result(tmp_path / "out")
    assert (result.status, result.score) == ("error", 0.0)
    assert "POSTTRAIN_INPUT_SPLIT" in (result.reason or "")
