"""Strict checkpoint loading: architecture, config and tokenizer from the pinned base model, and
nothing from the checkpoint but tensors out of `*.safetensors` files (never a pickle)."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel
from transformers.tokenization_utils_base import PreTrainedTokenizerBase

from graders.checkpoint_files import (
    InvalidCheckpoint,
    agent_bytes,
    checkpoint_root,
    scan_output_tree,
    weight_files,
)

FLOAT_DTYPES = frozenset({"F16", "BF16", "F32", "F64"})
# Room for a float64 copy of the base plus slack; beyond that it is not a checkpoint of this model.
MAX_SIZE_FACTOR = 4
MAX_SIZE_SLACK_BYTES = 1 << 20
MAX_NAMES_IN_REASON = 3


def _names(names: set[str]) -> str:
    shown = ", ".join(repr(name[:80]) for name in sorted(names)[:MAX_NAMES_IN_REASON])
    more = len(names) - MAX_NAMES_IN_REASON
    return shown + (f" and {more} more" if more > 0 else "")


def base_tensor_shapes(base_dir: Path) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor the pinned base model stores: the checkpoint must match it."""
    shapes: dict[str, tuple[int, ...]] = {}
    for path in sorted(base_dir.glob("*.safetensors")):
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                shapes[name] = tuple(handle.get_slice(name).get_shape())
    if not shapes:
        raise RuntimeError(f"the base model at {base_dir} has no safetensors weights")
    return shapes


def read_checkpoint_tensors(
    checkpoint_dir: Path, expected: dict[str, tuple[int, ...]]
) -> dict[str, torch.Tensor]:
    """Tensors of the checkpoint, after checking names, shapes, dtypes, sizes and values (finite)
    against `expected`. Call it inside `agent_bytes`: the safetensors library raises its own errors."""
    root = scan_output_tree(checkpoint_dir)
    files = weight_files(root)
    expected_bytes = sum(4 * _numel(shape) for shape in expected.values())
    total = sum(path.stat().st_size for path in files)
    if total > MAX_SIZE_FACTOR * expected_bytes + MAX_SIZE_SLACK_BYTES:
        raise InvalidCheckpoint(f"weights take {total} bytes, far more than this model's {expected_bytes}")

    tensors: dict[str, torch.Tensor] = {}
    unexpected: set[str] = set()
    for path in files:
        try:
            handle_context = safe_open(str(path), framework="pt")
        except Exception as exc:  # safetensors raises its own error types for a bad header
            raise InvalidCheckpoint(f"{path.name!r} is not a valid safetensors file: {exc}") from None
        with handle_context as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                if name not in expected:
                    unexpected.add(name)
                    continue
                if name in tensors:
                    raise InvalidCheckpoint(f"tensor {name!r} appears in more than one file")
                view = handle.get_slice(name)
                shape = tuple(view.get_shape())
                if shape != expected[name]:
                    raise InvalidCheckpoint(
                        f"tensor {name!r} has shape {list(shape)}, expected {list(expected[name])}"
                    )
                if view.get_dtype() not in FLOAT_DTYPES:
                    raise InvalidCheckpoint(
                        f"tensor {name!r} has dtype {view.get_dtype()}, expected a float type"
                    )
                tensor = handle.get_tensor(name)
                if not bool(torch.isfinite(tensor).all()):
                    raise InvalidCheckpoint(f"tensor {name!r} holds NaN or infinite values")
                tensors[name] = tensor
    if unexpected:
        raise InvalidCheckpoint(f"unexpected tensors: {_names(unexpected)}")
    missing = set(expected) - set(tensors)
    if missing:
        raise InvalidCheckpoint(f"missing tensors: {_names(missing)}")
    return tensors


def _numel(shape: tuple[int, ...]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def load_strict(base_dir: Path, checkpoint_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model's architecture, config and tokenizer, with the checkpoint's weights.

    Raises InvalidCheckpoint for anything wrong with the checkpoint's bytes; the base model's
    failures (and a missing checkpoint mount) are the platform's and raise as themselves.
    """
    expected = base_tensor_shapes(base_dir)
    checkpoint_root(checkpoint_dir)
    with agent_bytes("the checkpoint cannot be read"):
        tensors = read_checkpoint_tensors(checkpoint_dir, expected)
    tokenizer = AutoTokenizer.from_pretrained(base_dir, local_files_only=True, trust_remote_code=False)
    model = AutoModelForCausalLM.from_pretrained(
        base_dir, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=torch.float32
    )
    with torch.no_grad(), agent_bytes("the checkpoint's tensors do not load into the base model"):
        outcome = model.load_state_dict(tensors, strict=False)
    if outcome.unexpected_keys:
        # The names matched the base's files, so this is a mismatch between the base and its own code.
        raise RuntimeError(f"the base model does not accept its own tensors: {outcome.unexpected_keys[:3]}")
    model.train(False)
    return model, tokenizer
