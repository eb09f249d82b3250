"""Checks on an output tree before any byte of it is parsed (standard library only).

Who is to blame for a failure decides the outcome: anything raised while reading or checking the
bytes an agent's job wrote is `invalid_checkpoint` (score 0); only the platform's own failures (an
input it did not mount, the grader running out of memory) are `error` (reward null). `agent_bytes`
draws that line, so an agent can never turn its own bad output into a platform failure.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Iterator
from pathlib import Path

# Formats that can execute code when loaded (pickle and friends): never loaded, and their presence
# makes the checkpoint invalid so it cannot pass as something the grader would have read.
PICKLE_SUFFIXES = frozenset({".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".joblib", ".npy", ".npz"})
WEIGHTS_SUFFIX = ".safetensors"
MAX_TREE_ENTRIES = 10_000
MAX_TREE_DEPTH = 64


class InvalidCheckpoint(Exception):
    """The agent's output cannot be graded; the result is `invalid_checkpoint` with this reason."""


@contextlib.contextmanager
def agent_bytes(what: str) -> Iterator[None]:
    """Every exception raised inside becomes InvalidCheckpoint (RecursionError from a deeply nested
    document, ValueError from a 5000-digit integer, a library's own parse error, ...), except
    MemoryError: the grader's memory is the platform's, and inputs are bounded before they are read."""
    try:
        yield
    except (InvalidCheckpoint, MemoryError):
        raise
    except Exception as exc:
        raise InvalidCheckpoint(f"{what}: {type(exc).__name__}: {exc}") from None


def checkpoint_root(mount: Path) -> Path:
    """The checkpoint input as the platform mounted it (it may be a link the platform made).

    A missing mount is the platform's failure, so this raises RuntimeError, not InvalidCheckpoint.
    """
    resolved = mount.resolve(strict=False)
    if not resolved.is_dir():
        raise RuntimeError(f"the checkpoint input {mount} is not a mounted directory")
    return resolved


def scan_output_tree(root: Path) -> Path:
    """Reject symlinks, special files, pickle-format files, and trees that are too large or too deep
    anywhere under `root` (see `checkpoint_root`); everything below it is agent-written.

    Returns the resolved root. Walks with an explicit stack: no recursion an agent could exhaust.
    """
    resolved = checkpoint_root(root)
    entries = 0
    stack: list[tuple[Path, int]] = [(resolved, 0)]
    while stack:
        directory, depth = stack.pop()
        try:
            children = sorted(os.scandir(directory), key=lambda entry: entry.name)
        except OSError as error:
            raise InvalidCheckpoint(f"cannot read the checkpoint tree: {error.strerror}") from None
        for entry in children:
            entries += 1
            if entries > MAX_TREE_ENTRIES:
                raise InvalidCheckpoint(f"the checkpoint has more than {MAX_TREE_ENTRIES} entries")
            path = Path(entry.path)
            relative = str(path.relative_to(resolved))
            mode = entry.stat(follow_symlinks=False).st_mode
            if stat.S_ISLNK(mode):
                raise InvalidCheckpoint(f"symlink in the checkpoint: {relative!r}")
            if stat.S_ISDIR(mode):
                if depth + 1 >= MAX_TREE_DEPTH:
                    raise InvalidCheckpoint(f"directories nested deeper than {MAX_TREE_DEPTH} levels")
                stack.append((path, depth + 1))
                continue
            if not stat.S_ISREG(mode):
                raise InvalidCheckpoint(f"not a regular file: {relative!r}")
            if path.suffix.lower() in PICKLE_SUFFIXES:
                raise InvalidCheckpoint(f"pickle-format file in the checkpoint: {relative!r}")
    return resolved


def read_bounded(path: Path, limit: int) -> bytes:
    """At most `limit` bytes of a regular file, opened without following a link and without
    blocking on a FIFO; InvalidCheckpoint if it is longer."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as stream:
        if not stat.S_ISREG(os.fstat(stream.fileno()).st_mode):
            raise InvalidCheckpoint(f"{path.name!r} is not a regular file")
        data = stream.read(limit + 1)
    if len(data) > limit:
        raise InvalidCheckpoint(f"{path.name!r} is larger than {limit} bytes")
    return data


def weight_files(root: Path) -> list[Path]:
    """The `*.safetensors` files directly in `root` (after `scan_output_tree`); subdirs are ignored."""
    files = sorted(path for path in root.iterdir() if path.name.endswith(WEIGHTS_SUFFIX) and path.is_file())
    if not files:
        raise InvalidCheckpoint("no *.safetensors weights directly in the checkpoint dir")
    return files
