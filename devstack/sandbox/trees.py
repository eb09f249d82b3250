"""File trees that jobs wrote or will read: walked and changed without ever following a symbolic link.

The emulator runs as root and jobs publish whatever they like into their outputs, so a walk that
followed links could chmod, copy or delete anything on the host. Every walk here opens each entry
relative to its parent with `O_NOFOLLOW`, and changes modes through that descriptor.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

# Published outputs deeper or larger than this are refused: the walks below hold one descriptor per
# level, and nothing a grader reads is nested anywhere near as deep.
MAX_PUBLISHED_DEPTH = 64
MAX_PUBLISHED_ENTRIES = 100_000
_MAX_LINK_HOPS = 40  # the kernel's own limit (ELOOP)

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeTree(ValueError):
    """A tree holds something that must not be published or copied; the message says what."""


def _walk_fds(root: Path, max_depth: int) -> Iterator[tuple[int, str, os.stat_result, str]]:
    """(parent dir fd, name, lstat, path relative to root) of every entry under `root`, depth first.

    `root` itself must be a real directory (a link to one is refused by O_NOFOLLOW). One descriptor
    is held per level, hence `max_depth`.
    """
    top = os.open(root, _DIR_FLAGS)
    stack: list[tuple[int, str, Iterator[os.DirEntry[str]]]] = [(top, "", iter(list(os.scandir(top))))]
    try:
        while stack:
            dirfd, prefix, entries = stack[-1]
            entry = next(entries, None)
            if entry is None:
                os.close(stack.pop()[0])
                continue
            st = entry.stat(follow_symlinks=False)
            rel = posixpath.join(prefix, entry.name) if prefix else entry.name
            yield dirfd, entry.name, st, rel
            if stat.S_ISDIR(st.st_mode):
                if len(stack) >= max_depth:
                    raise UnsafeTree(f"directories nested deeper than {max_depth} levels")
                child = os.open(entry.name, _DIR_FLAGS, dir_fd=dirfd)
                stack.append((child, rel, iter(list(os.scandir(child)))))
    finally:
        for fd, _, _ in stack:
            os.close(fd)


def _chmod_entry(dirfd: int, name: str, mode: int) -> None:
    """chmod the entry itself, never what a link would lead to (O_PATH + /proc/self/fd)."""
    fd = os.open(name, _PATH_FLAGS, dir_fd=dirfd)
    try:
        if stat.S_ISLNK(os.fstat(fd).st_mode):
            return
        os.chmod(f"/proc/self/fd/{fd}", mode)
    finally:
        os.close(fd)


def _chmod_tree(root: Path, dir_mode: int, file_mode: int | None) -> None:
    for dirfd, name, st, _ in _walk_fds(root, max_depth=MAX_PUBLISHED_DEPTH * 4):
        if stat.S_ISDIR(st.st_mode):
            _chmod_entry(dirfd, name, dir_mode)
        elif stat.S_ISREG(st.st_mode) and file_mode is not None:
            _chmod_entry(dirfd, name, file_mode)
    fd = os.open(root, _DIR_FLAGS)
    try:
        os.fchmod(fd, dir_mode)
    finally:
        os.close(fd)


def make_read_only(root: Path) -> None:
    """Directories 0555 and regular files 0444 under `root`, itself included. Symbolic links are
    skipped, not followed: whatever a link points to keeps its mode."""
    _chmod_tree(root, 0o555, 0o444)


def make_writable(root: Path) -> None:
    """Undo `make_read_only` on directories (0755) so a tree can be deleted; links are skipped."""
    if not root.exists() or root.is_symlink():
        return
    _chmod_tree(root, 0o755, None)


def remove_tree(root: Path) -> None:
    if root.is_symlink():
        root.unlink()
        return
    with contextlib.suppress(OSError):  # rmtree below still removes what it can
        make_writable(root)
    shutil.rmtree(root, ignore_errors=True)


def _escapes(root: Path, link: str) -> bool:
    """Whether the symbolic link at `link` (relative to `root`) resolves outside `root`.

    Resolved component by component inside the tree, following the tree's own links, because a
    purely lexical check misses `a/link/../x` where `link` points elsewhere in the tree.
    """
    target = os.readlink(root / link)
    if target.startswith("/"):
        return True
    parts = link.split("/")[:-1]  # the directory the link sits in
    pending = target.split("/")[::-1]
    hops = 0
    while pending:
        part = pending.pop()
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return True
            parts.pop()
            continue
        current = "/".join([*parts, part])
        try:
            st = os.lstat(root / current)
        except OSError:
            parts.append(part)  # dangling from here on: nothing below it can lead anywhere
            continue
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > _MAX_LINK_HOPS:
                return True
            target = os.readlink(root / current)
            if target.startswith("/"):
                return True
            pending.extend(target.split("/")[::-1])
            continue
        parts.append(part)
    return False


def check_publishable(root: Path) -> None:
    """Raise UnsafeTree unless `root` holds only directories, regular files and symbolic links that
    resolve inside `root`, at most MAX_PUBLISHED_DEPTH deep and MAX_PUBLISHED_ENTRIES entries."""
    for count, (dirfd, name, st, rel) in enumerate(_walk_fds(root, max_depth=MAX_PUBLISHED_DEPTH), 1):
        if count > MAX_PUBLISHED_ENTRIES:
            raise UnsafeTree(f"more than {MAX_PUBLISHED_ENTRIES} entries")
        if stat.S_ISLNK(st.st_mode):
            if _escapes(root, rel):  # a loop counts as leading outside
                target = os.readlink(name, dir_fd=dirfd)
                raise UnsafeTree(
                    f"{rel!r} is a symbolic link to {target!r}, which leads outside the output dir"
                )
        elif not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            raise UnsafeTree(f"{rel!r} is not a regular file, a directory or a symbolic link")


def copy_regular_file(src: str, dst: str) -> None:
    """A `shutil.copytree` copy function that copies regular files only (a FIFO would block the copy
    forever, a device would be read as root) and never follows a link."""
    fd = os.open(src, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise UnsafeTree(f"{src} is not a regular file")
        with os.fdopen(os.dup(fd), "rb") as source, open(dst, "wb") as target:
            shutil.copyfileobj(source, target)
    finally:
        os.close(fd)
    shutil.copystat(src, dst, follow_symlinks=False)
