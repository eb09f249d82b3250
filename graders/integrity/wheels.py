"""The text inside the wheels a submission's jobs installed: a package can carry hidden-split items as
well as a script can. The operator mounts each job's staged wheels (what the job installed, from the
index it was given) into the score job; each `.whl` is a zip, read member by member with every size
bounded by what is read, not by what the archive declares (a zip bomb stops at the limit)."""

from __future__ import annotations

import zipfile
from collections.abc import Iterable, Iterator
from pathlib import Path

from graders.integrity.files import TextFileStats, decoded, open_regular, regular_files

WHEEL_SUFFIX = ".whl"
MAX_MEMBERS = 100_000  # per wheel


def wheel_texts(
    roots: Iterable[tuple[str, Path]],
    *,
    max_member_bytes: int,
    max_total_bytes: int,
    stats: TextFileStats,
) -> Iterator[tuple[str, str]]:
    """(label/wheel file/member, text) of every UTF-8 member of every wheel under each (label, root),
    in name order; `stats` counts them with the other files read (one total)."""
    for label, root in roots:
        for relative, path, _ in regular_files(root, stats):
            if not relative.endswith(WHEEL_SUFFIX):
                continue
            stream = open_regular(path, stats)
            if stream is None:
                continue
            with stream:
                try:
                    archive = zipfile.ZipFile(stream)
                except (zipfile.BadZipFile, OSError):
                    stats.skipped_unreadable += 1
                    continue
                with archive:
                    for where, text in _members(archive, max_member_bytes, max_total_bytes, stats):
                        yield f"{label}/{relative}/{where}", text
            if stats.truncated:
                return


def _members(
    archive: zipfile.ZipFile, max_member_bytes: int, max_total_bytes: int, stats: TextFileStats
) -> Iterator[tuple[str, str]]:
    members = sorted((m for m in archive.infolist() if not m.is_dir()), key=lambda m: m.filename)
    if len(members) > MAX_MEMBERS:
        members = members[:MAX_MEMBERS]
        stats.truncated = True
    for member in members:
        if member.file_size > max_member_bytes:
            stats.skipped_too_large += 1
            continue
        limit = min(max_member_bytes, max_total_bytes - stats.bytes_read)
        try:
            with archive.open(member) as stream:
                data = stream.read(limit + 1)  # the declared size can lie: read no more than allowed
        except (zipfile.BadZipFile, NotImplementedError, OSError, EOFError, RuntimeError):
            stats.skipped_unreadable += 1
            continue
        if len(data) > limit:
            if limit < max_member_bytes:  # the total's end, not this member's size
                stats.truncated = True
                return
            stats.skipped_too_large += 1
            continue
        text = decoded(data, stats)
        if text is not None:
            yield member.filename, text
