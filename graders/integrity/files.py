"""Reading what an agent left on disk for screening: every file below a root is untrusted, so links
are never followed, only regular files are opened (never blocking on a FIFO), and sizes and entry
counts are bounded. Text is UTF-8 without a NUL byte near its start; anything else is binary."""

from __future__ import annotations

import errno
import itertools
import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

BINARY_SNIFF_BYTES = 8192
MAX_TREE_ENTRIES = 100_000
SKIPPED_SUFFIXES = (".safetensors",)


def size_text(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count} bytes"


@dataclass
class TextFileStats:
    """What `text_files` read and what it left out, for a line such as "3 files skipped: ..."."""

    files_read: int = 0
    bytes_read: int = 0
    skipped_binary: int = 0  # weights, a NUL byte near the start, or not UTF-8
    skipped_too_large: int = 0
    skipped_not_regular: int = 0  # symlinks, FIFOs, sockets, devices: never opened nor followed
    skipped_unreadable: int = 0
    entries_seen: int = 0
    truncated: bool = False  # stopped at max_total_bytes or MAX_TREE_ENTRIES

    def _kinds(self) -> dict[str, int]:
        return {
            "binary": self.skipped_binary,
            "too large": self.skipped_too_large,
            "not a regular file": self.skipped_not_regular,
            "unreadable": self.skipped_unreadable,
        }

    @property
    def skipped(self) -> int:
        return sum(self._kinds().values())

    def summary(self) -> str:
        line = f"{self.files_read} files read ({size_text(self.bytes_read)})"
        if self.skipped:
            kinds = ", ".join(f"{count} {kind}" for kind, count in self._kinds().items() if count)
            line += f"; {self.skipped} skipped: {kinds}"
        return line + ("; stopped at the size limit" if self.truncated else "")


def text_files(
    roots: Iterable[tuple[str, Path]],
    *,
    max_file_bytes: int,
    max_total_bytes: int,
    stats: TextFileStats | None = None,
    skip: frozenset[str] = frozenset(),
) -> Iterator[tuple[str, str]]:
    """(label/relative path, text) of every UTF-8 file under each (label, root), in name order, but
    those whose relative path is in `skip` (read otherwise).

    Everything below a root is untrusted: links are never followed, only regular files are opened
    (without following a link and without blocking on a FIFO), and sizes are bounded. A root itself
    is the platform's. `stats`, when given, is filled in as the files are read.
    """
    stats = stats if stats is not None else TextFileStats()
    for label, root in roots:
        for relative, path, size in regular_files(root, stats):
            if relative in skip:
                continue
            if path.name.endswith(SKIPPED_SUFFIXES):
                stats.skipped_binary += 1
                continue
            if size > max_file_bytes:
                stats.skipped_too_large += 1
                continue
            if stats.bytes_read + size > max_total_bytes:
                stats.truncated = True
                return
            data = _read_regular(path, size, stats)  # a file grown since it was listed is too large
            if data is None:
                continue
            text = decoded(data, stats)
            if text is not None:
                yield f"{label}/{relative}", text
        if stats.truncated:
            return


def decoded(data: bytes, stats: TextFileStats) -> str | None:
    """`data` read (counted in `stats`) as text, or None when it is binary: a NUL byte near the start,
    or not UTF-8."""
    stats.bytes_read += len(data)
    if b"\0" in data[:BINARY_SNIFF_BYTES]:
        stats.skipped_binary += 1
        return None
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError:
        stats.skipped_binary += 1
        return None
    stats.files_read += 1
    return text


def regular_files(root: Path, stats: TextFileStats) -> Iterator[tuple[str, Path, int]]:
    """(relative path, path, size) of the regular files under `root`, by lstat. An explicit stack,
    not recursion: an agent can nest directories deeper than Python's recursion limit."""
    stack: list[tuple[Path, str]] = [(root, "")]
    while stack:
        directory, prefix = stack.pop()
        try:
            with os.scandir(directory) as listing:  # a huge directory is read no further than the limit
                entries = list(itertools.islice(listing, MAX_TREE_ENTRIES - stats.entries_seen))
                stats.entries_seen += len(entries)
                stats.truncated = next(listing, None) is not None
        except OSError:
            if prefix:  # a missing root is a job that wrote nothing
                stats.skipped_unreadable += 1
            continue
        files: list[tuple[str, Path, int]] = []
        # Reverse name order: files are yielded reversed back, and the first directory pops first.
        for entry in sorted(entries, key=lambda entry: entry.name, reverse=True):
            try:
                info = entry.stat(follow_symlinks=False)
            except OSError:
                stats.skipped_unreadable += 1
                continue
            relative = prefix + entry.name
            if stat.S_ISDIR(info.st_mode):
                stack.append((Path(entry.path), relative + "/"))
            elif stat.S_ISREG(info.st_mode):
                files.append((relative, Path(entry.path), info.st_size))
            else:
                stats.skipped_not_regular += 1
        yield from reversed(files)
        if stats.truncated:
            return


def read_regular(path: Path, limit: int) -> bytes | None:
    """At most `limit` bytes of a regular file, never through a link nor blocking on a FIFO; None
    when `path` is anything else, or missing."""
    try:
        size = os.lstat(path).st_size
    except OSError:
        return None
    return _read_regular(path, min(size, limit), TextFileStats())


def _read_regular(path: Path, limit: int, stats: TextFileStats) -> bytes | None:
    """At most `limit` bytes, or None (counted in `stats`) when the file changed into something
    else since it was listed: a link, a FIFO or a larger file."""
    stream = open_regular(path, stats)
    if stream is None:
        return None
    with stream:
        try:
            data = stream.read(limit + 1)
        except OSError:
            stats.skipped_unreadable += 1
            return None
    if len(data) > limit:
        stats.skipped_too_large += 1
        return None
    return data


def open_regular(path: Path, stats: TextFileStats) -> BinaryIO | None:
    """`path` opened for reading if it is a regular file: never through a link (O_NOFOLLOW) nor
    blocking on a FIFO (O_NONBLOCK, fstat); None (counted in `stats`) otherwise."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as error:
        if error.errno == errno.ELOOP:
            stats.skipped_not_regular += 1
        else:
            stats.skipped_unreadable += 1
        return None
    stream = os.fdopen(fd, "rb")
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        stream.close()
        stats.skipped_not_regular += 1
        return None
    return stream
