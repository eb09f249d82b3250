"""Checks on an output tree before any byte of it is parsed (standard library only)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

# Formats that can execute code when loaded (pickle and friends): never loaded, and their presence
# makes the checkpoint invalid so it cannot pass as something the grader would have read.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz"})
WEIGHTS_SUFFIX = ".safetensors"
MAX_TREE_ENTRIES = 10_000


class InvalidCheckpoint(Exception):
    """The agent's output cannot be graded; the result is `invalid_checkpoint` with this reason."""


def scan_output_tree(root: Path) -> Path:
    """Reject symlinks, special files and pickle-format files anywhere under `root`.

    `root` itself is the platform's mount point (it may be a symlink the platform made); everything
    below it is agent-written. Returns the resolved root.
    """
    resolved = root.resolve(strict=True)
    if not resolved.is_dir():
        raise InvalidCheckpoint("the checkpoint is not a directory")
    entries = 0

    def fail_walk(error: OSError) -> None:
        raise InvalidCheckpoint(f"cannot read the checkpoint tree: {error.strerror}")

    for directory, subdirs, files in os.walk(resolved, followlinks=False, onerror=fail_walk):
        for name in [*subdirs, *files]:
            entries += 1
            if entries > MAX_TREE_ENTRIES:
                raise InvalidCheckpoint(f"the checkpoint has more than {MAX_TREE_ENTRIES} entries")
            path = Path(directory, name)
            relative = path.relative_to(resolved)
            mode = path.lstat().st_mode
            if stat.S_ISLNK(mode):
                raise InvalidCheckpoint(f"symlink in the checkpoint: {str(relative)!r}")
            if stat.S_ISDIR(mode):
                continue
            if not stat.S_ISREG(mode):
                raise InvalidCheckpoint(f"not a regular file: {str(relative)!r}")
            if path.suffix.lower() in PICKLE_SUFFIXES:
                raise InvalidCheckpoint(f"pickle-format file in the checkpoint: {str(relative)!r}")
    return resolved


def weight_files(root: Path) -> list[Path]:
    """The `*.safetensors` files directly in `root` (after `scan_output_tree`); subdirs are ignored."""
    files = sorted(path for path in root.iterdir() if path.name.endswith(WEIGHTS_SUFFIX) and path.is_file())
    if not files:
        raise InvalidCheckpoint("no *.safetensors weights directly in the checkpoint dir")
    return files
