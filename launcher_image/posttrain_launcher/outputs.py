"""The job's files as the launcher measures and clears them once the job is stopped or has ended:
never through a link the job planted."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat


def tree_size(path: str, stop_above: int) -> int:
    """Apparent size of every non-directory entry under `path`, symlinks not followed.

    Stops counting once past `stop_above`. Sparse files count at full size on purpose: that is
    what an upload of the artifact would move.
    """
    total = 0
    stack = [path]
    while stack and total <= stop_above:
        try:
            entries = list(os.scandir(stack.pop()))
        except OSError:
            continue
        for entry in entries:
            try:
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
                else:
                    total += entry.stat(follow_symlinks=False).st_size
            except OSError:
                continue
    return total


def file_at(roots: list[str], size: int) -> str | None:
    """A regular file of exactly `size` bytes under `roots` (os.walk follows no link), if any: one a write
    past RLIMIT_FSIZE stopped at. (Python ignores SIGXFSZ, so such a job sees EFBIG, not a kill.)"""
    for root in roots:
        for parent, _, files in os.walk(root):
            for name in files:
                with contextlib.suppress(OSError):
                    st = os.lstat(os.path.join(parent, name))
                    if stat.S_ISREG(st.st_mode) and st.st_size == size:
                        return os.path.relpath(os.path.join(parent, name), root)
    return None


def clear_outputs(output_dir: str) -> None:
    """Remove everything the job left in its outputs, so nothing of a stopped job is published. Runs
    once no process of the job is left; never follows a link (rmtree works from directory fds)."""
    for entry in os.scandir(output_dir):
        with contextlib.suppress(FileNotFoundError):
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path)
            else:
                os.unlink(entry.path)
