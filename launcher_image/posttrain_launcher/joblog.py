"""The job's log: its stdout and stderr relayed to the launcher's own (what the backend keeps and
`jobs_logs` reads), and copied into a file in its outputs (what the agent reads afterwards).

Both copies are bounded and both keep the two ends a researcher needs: the head (the setup, the
first errors) and the tail (the last loss, the traceback). Each passes bytes through as they come
until its head budget is spent, then holds only the newest bytes in memory, and writes them after
one marker line saying how much was skipped when the job ends.
"""

from __future__ import annotations

import collections
import contextlib
import os
from collections.abc import Callable

PREFIX = "posttrain-launcher: "
LOG_FILE_NAME = "posttrain-job.log"
# One part in TAIL_SHARE of each budget is kept for the tail; the rest is the head.
TAIL_SHARE = 4

Write = Callable[[int, bytes], None]


class _Tail:
    """The newest `keep` bytes added, as (destination, bytes) chunks in order."""

    def __init__(self, keep: int) -> None:
        self.keep = keep
        self.added = 0
        self._size = 0
        self._chunks: collections.deque[tuple[int, bytes]] = collections.deque()

    def add(self, dest: int, data: bytes) -> None:
        self.added += len(data)
        self._chunks.append((dest, data[-self.keep :]))
        self._size += min(len(data), self.keep)
        while self._size > self.keep:
            first_dest, first = self._chunks.popleft()
            excess = self._size - self.keep
            if len(first) > excess:
                self._chunks.appendleft((first_dest, first[excess:]))
                self._size -= excess
            else:
                self._size -= len(first)

    def kept(self) -> list[tuple[int, bytes]]:
        """What is held; when older bytes were dropped, from the first whole line on (if any)."""
        chunks = list(self._chunks)
        if self.added == self._size:
            return chunks
        for i, (dest, data) in enumerate(chunks):
            cut = data.find(b"\n")
            if cut >= 0:
                return [(dest, data[cut + 1 :]), *chunks[i + 1 :]]
        return chunks


class BoundedLog:
    """One bounded copy of the log: the head passed on as it comes, the tail at `close`."""

    def __init__(self, budget: int, write: Write) -> None:
        self.budget = budget
        self._head_left = budget - budget // TAIL_SHARE
        self._tail = _Tail(budget // TAIL_SHARE)
        self._write = write
        self._last_byte: dict[int, bytes] = {}

    @property
    def overflowed(self) -> bool:
        return self._tail.added > self._tail.keep

    def feed(self, dest: int, data: bytes) -> None:
        if self._head_left > 0:
            head, data = data[: self._head_left], data[self._head_left :]
            self._head_left -= len(head)
            self._emit(dest, head)
        if data:
            self._tail.add(dest, data)

    def close(self, marker_dest: int) -> None:
        kept = self._tail.kept()
        skipped = self._tail.added - sum(len(data) for _, data in kept)
        if skipped:
            lead = "" if self._last_byte.get(marker_dest, b"\n") == b"\n" else "\n"
            head = self.budget - self._tail.keep
            marker = f"{lead}{PREFIX}log: {skipped} bytes skipped after the first {head}; the end follows\n"
            self._emit(marker_dest, marker.encode())
        for dest, data in kept:
            self._emit(dest, data)

    def _emit(self, dest: int, data: bytes) -> None:
        if data:
            self._last_byte[dest] = data[-1:]
            self._write(dest, data)


def write_all(fd: int, data: bytes) -> None:
    try:
        while data:
            data = data[os.write(fd, data) :]
    except OSError:
        pass  # whoever reads this went away (or the disk is full); the job goes on and is drained


class JobLog:
    """The relayed stream and, when there is one, the file copy in the outputs."""

    def __init__(self, stream_budget: int, file_fd: int | None, file_budget: int) -> None:
        self.stream = BoundedLog(stream_budget, write_all)
        self.file = (
            BoundedLog(file_budget, lambda _dest, data: write_all(file_fd, data))
            if file_fd is not None and file_budget > 0
            else None
        )
        self._file_fd = file_fd

    def feed(self, dest: int, data: bytes) -> None:
        self.stream.feed(dest, data)
        if self.file is not None:
            self.file.feed(dest, data)

    def close(self, marker_dest: int) -> None:
        self.stream.close(marker_dest)
        if self.file is not None:
            self.file.close(marker_dest)
        if self._file_fd is not None:
            os.close(self._file_fd)


def open_log_file(output_dir: str) -> int:
    """Create the log file in the outputs before any job code runs: a new file (never one the job
    placed, nor a link it planted), readable by whoever collects the outputs."""
    path = os.path.join(output_dir, LOG_FILE_NAME)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
