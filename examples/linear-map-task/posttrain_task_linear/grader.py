"""Grader of `t1_linear_map`: exact match of round(weight @ x + bias) on the mounted split.

Only safetensors are read, bounded in size before parsing, and every tensor is checked by name,
shape, dtype and finiteness: the checkpoint is agent-written.
"""

from __future__ import annotations

import numpy as np
from safetensors.numpy import load

from graders.assets.datasets import read_jsonl
from graders.checkpoint_files import (
    InvalidCheckpoint,
    agent_bytes,
    checkpoint_root,
    read_bounded,
    scan_output_tree,
    weight_files,
)
from graders.inputs import GraderInputs
from graders.result import GraderResult
from graders.tasks import DATASET_FILE, Task
from posttrain_task_linear.data import INPUT_SIZE, OUTPUT_SIZE

GRADER_VERSION = "linear_map/1"
MAX_WEIGHTS_BYTES = 1 << 20
SHAPES = {"weight": (OUTPUT_SIZE, INPUT_SIZE), "bias": (OUTPUT_SIZE,)}


def _read_map(inputs: GraderInputs) -> tuple[np.ndarray, np.ndarray]:
    files = weight_files(scan_output_tree(inputs.checkpoint))
    if len(files) != 1:
        raise InvalidCheckpoint(f"expected one *.safetensors file, found {len(files)}")
    tensors = load(read_bounded(files[0], MAX_WEIGHTS_BYTES))
    unknown = sorted(set(tensors) - set(SHAPES))
    if unknown or "weight" not in tensors:
        raise InvalidCheckpoint(f"tensors must be 'weight' and optionally 'bias', got {sorted(tensors)}")
    for name, tensor in tensors.items():
        if tensor.shape != SHAPES[name] or tensor.dtype.kind != "f":
            raise InvalidCheckpoint(f"{name} must be a float tensor of shape {list(SHAPES[name])}")
        if not np.isfinite(tensor).all():
            raise InvalidCheckpoint(f"{name} has non-finite values")
    bias = tensors.get("bias", np.zeros(OUTPUT_SIZE))
    return tensors["weight"].astype(np.float64), bias.astype(np.float64)


def grade(task: Task, inputs: GraderInputs) -> GraderResult:
    records = read_jsonl(inputs.split / DATASET_FILE)
    checkpoint_root(inputs.checkpoint)  # a missing mount is the platform's failure, not the agent's
    try:
        with agent_bytes("the weights cannot be read"):
            weight, bias = _read_map(inputs)
    except InvalidCheckpoint as exc:
        return GraderResult.invalid_checkpoint(str(exc), GRADER_VERSION)
    x = np.array([record["x"] for record in records], dtype=np.float64)
    y = np.array([record["y"] for record in records], dtype=np.int64)
    predicted = np.rint(x @ weight.T + bias)
    correct = int((predicted == y).all(axis=1).sum())
    return GraderResult(
        score=correct / len(records),
        n=len(records),
        status="ok",
        details={"correct": correct},
        grader_version=GRADER_VERSION,
    )
