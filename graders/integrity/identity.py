"""Model identity: does a checkpoint descend from the task's base model?

A fine-tune moves each weight matrix from where it started, and its cosine with the base's matrix
stays well above chance; another model with the same shapes (another seed, a re-initialised model)
has matrices all but orthogonal to the base's. The verdict rests on the share of matrix parameters in
tensors whose cosine with the base's is at least `min_cosine`; 1-D tensors (norms, biases) are left
out, since a re-initialised norm is all ones like an untrained base's.

Measured on the stand-ins (matrix cosines): the shipped t0_arithmetic_format SFT 0.93-0.94; the
gsm8k stand-in's SFT 0.22-0.51 (median 0.39; its base is an untrained init and the tiny model trains
at 3e-3, so its weights grow 3-7 times; 72 epochs instead of 24 barely move that); other seeds,
re-initialised or pre-trained, and a fine-tune of another seed's base, |cosine| <= 0.04 (<= 0.06 for
1k-element tensors). A `min_cosine` of 0.1 keeps about a 2x margin on both sides; 0.5 would call the
gsm8k stand-in's own SFT foreign. Against an untrained base, identity is weak evidence either way:
weights trained far from it look like another model with the base added.
A bf16 save of the unchanged base differs from it by rounding (relative change 2e-3, 6e-4 on gsm8k),
so "unchanged" also means bitwise equal to the base cast to the checkpoint's dtype.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import torch
from safetensors import safe_open

Verdict = Literal["descendant", "foreign", "unchanged"]
LOWEST_LISTED = 3
MAX_NAME_CHARS = 80
CHUNK_ELEMENTS = 1 << 22  # sums run in float64 over slices of this many elements: no overflow, small copies


@dataclass(frozen=True)
class TensorComparison:
    name: str
    numel: int
    matrix: bool  # ndim >= 2: counts towards kept_share
    cosine: float
    change_sq: float  # ||C - B||^2
    base_sq: float  # ||B||^2
    unchanged: bool  # bitwise equal to the base cast to the checkpoint's dtype


@dataclass(frozen=True)
class IdentityReport:
    verdict: Verdict
    kept_share: float  # of matrix parameters, the share in tensors with cosine >= cosine_threshold
    relative_change: float  # ||C - B|| / ||B|| over all tensors together
    tensors: int
    unchanged_tensors: int
    median_cosine: float  # over matrix tensors
    lowest_cosine: float
    lowest: tuple[tuple[str, float], ...]  # (name, cosine) of the matrix tensors furthest from the base
    cosine_threshold: float

    def summary(self) -> str:
        figures = (
            f"kept {self.kept_share:.2f} of matrix parameters (cosine >= {self.cosine_threshold:g} "
            f"with the base), relative change {self.relative_change:.3g}"
        )
        if self.verdict == "unchanged":
            equal = f"{self.unchanged_tensors} of {self.tensors} tensors equal to the base's"
            return f"{figures}: the base model unchanged ({equal})"
        if self.verdict == "foreign":
            return f"{figures}: not a descendant of the base"
        return f"{figures}: descends from the base"

    def figures(self) -> dict[str, float | int | str]:
        figures: dict[str, float | int | str] = {
            "verdict": self.verdict,
            "kept_share": round(self.kept_share, 4),
            "relative_change": float(f"{self.relative_change:.4g}"),
            "median_cosine": round(self.median_cosine, 4),
            "lowest_cosine": round(self.lowest_cosine, 4),
            "tensors": self.tensors,
            "unchanged_tensors": self.unchanged_tensors,
        }
        if self.lowest:
            figures["lowest_tensor"] = self.lowest[0][0]
        return figures


def compare(
    base_dir: Path,
    checkpoint: Mapping[str, torch.Tensor],
    *,
    min_cosine: float,
    min_kept_share: float,
    min_relative_change: float,
) -> IdentityReport:
    """Compare `checkpoint` (names and shapes already checked against the base, as
    `graders.checkpoint.read_checkpoint_tensors` does) with the base's tensors, read one at a time."""
    files = sorted(base_dir.glob("*.safetensors"))
    if not files:
        raise RuntimeError(f"the base model at {base_dir} has no safetensors weights")
    rows: list[TensorComparison] = []
    for path in files:
        with safe_open(str(path), framework="pt") as handle:
            for name in handle.keys():  # noqa: SIM118 - safe_open handles are not mappings
                if name not in checkpoint:
                    raise ValueError(f"the checkpoint has no tensor {name[:MAX_NAME_CHARS]!r}")
                rows.append(compare_tensor(name, handle.get_tensor(name), checkpoint[name]))
    return summarise(
        rows, min_cosine=min_cosine, min_kept_share=min_kept_share, min_relative_change=min_relative_change
    )


@torch.no_grad()
def compare_tensor(name: str, base: torch.Tensor, checkpoint: torch.Tensor) -> TensorComparison:
    if base.shape != checkpoint.shape:
        raise ValueError(
            f"tensor {name[:MAX_NAME_CHARS]!r}: shape {list(checkpoint.shape)}, base {list(base.shape)}"
        )
    # A bf16 (or fp16) save of the base rounds its weights: equal after the same cast is unchanged.
    unchanged = torch.equal(base.to(checkpoint.dtype), checkpoint)
    # float32 would overflow on an agent's huge weights: an infinite norm, and NaN or inf in the figures.
    flat_base, flat_checkpoint = base.reshape(-1), checkpoint.reshape(-1)
    dot = base_sq = checkpoint_sq = change_sq = 0.0
    for start in range(0, flat_base.numel(), CHUNK_ELEMENTS):
        b = flat_base[start : start + CHUNK_ELEMENTS].to(torch.float64)
        c = flat_checkpoint[start : start + CHUNK_ELEMENTS].to(torch.float64)
        dot += float(b @ c)
        base_sq += float(b @ b)
        checkpoint_sq += float(c @ c)
        change_sq += float((c - b) @ (c - b))
    if base_sq > 0.0 and checkpoint_sq > 0.0:
        cosine = dot / math.sqrt(base_sq * checkpoint_sq)
    else:  # a zero tensor points nowhere: kept only if both are zero
        cosine = 1.0 if base_sq == checkpoint_sq else 0.0
    return TensorComparison(
        name=name,
        numel=flat_base.numel(),
        matrix=base.ndim >= 2,
        cosine=max(-1.0, min(1.0, cosine)) if math.isfinite(cosine) else 0.0,
        change_sq=change_sq,
        base_sq=base_sq,
        unchanged=unchanged,
    )


def summarise(
    rows: list[TensorComparison], *, min_cosine: float, min_kept_share: float, min_relative_change: float
) -> IdentityReport:
    # A model of only 1-D tensors has no matrices: then every tensor counts.
    matrices = [row for row in rows if row.matrix] or rows
    weight = sum(row.numel for row in matrices)
    kept = sum(row.numel for row in matrices if row.cosine >= min_cosine)
    kept_share = kept / weight if weight else 1.0
    change_sq = sum(row.change_sq for row in rows)
    base_sq = sum(row.base_sq for row in rows)
    # An all-zero base (no scale to measure against): the absolute change, finite for the report's JSON.
    relative_change = math.sqrt(change_sq / base_sq) if base_sq > 0.0 else math.sqrt(change_sq)
    unchanged = sum(1 for row in rows if row.unchanged)
    cosines = [row.cosine for row in matrices]
    lowest = sorted(matrices, key=lambda row: row.cosine)[:LOWEST_LISTED]

    verdict: Verdict = "descendant"
    if relative_change < min_relative_change or unchanged == len(rows):
        verdict = "unchanged"
    elif kept_share < min_kept_share:
        verdict = "foreign"
    return IdentityReport(
        verdict=verdict,
        kept_share=kept_share,
        relative_change=relative_change,
        tensors=len(rows),
        unchanged_tensors=unchanged,
        median_cosine=statistics.median(cosines) if cosines else 1.0,
        lowest_cosine=min(cosines, default=1.0),
        lowest=tuple((row.name[:MAX_NAME_CHARS], row.cosine) for row in lowest),
        cosine_threshold=min_cosine,
    )
