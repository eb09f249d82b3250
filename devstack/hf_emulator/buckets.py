"""The bucket read path that `HfFileSystem` uses (`docs/hf-jobs-api.md`), served from directories.

Jobs write these directories, so nothing here follows a symbolic link: a job could otherwise
publish a link to any file on the host and have the emulator (possibly root) serve it.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

from devstack.hf_emulator.job_state import iso_z


class BucketError(Exception):
    def __init__(self, status: int, message: str, error_code: str) -> None:
        super().__init__(message)
        self.status, self.message, self.error_code = status, message, error_code


def _not_found_bucket(bucket_id: str) -> BucketError:
    # X-Error-Code RepoNotFound on a bucket URL is what makes the client raise BucketNotFoundError.
    return BucketError(404, f"Bucket {bucket_id} not found", "RepoNotFound")


def _walk(root: Path) -> list[tuple[str, os.stat_result]]:
    """(relative path, lstat) of every regular file and directory below root, links skipped."""
    out: list[tuple[str, os.stat_result]] = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            full = os.path.join(dirpath, name)
            st = os.lstat(full)
            if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
                out.append((os.path.relpath(full, root), st))
        dirnames[:] = [d for d in dirnames if not os.path.islink(os.path.join(dirpath, d))]
    return out


def info(root: Path, bucket_id: str) -> dict[str, Any]:
    if not root.is_dir():
        raise _not_found_bucket(bucket_id)
    files = [st for _, st in _walk(root) if stat.S_ISREG(st.st_mode)]
    return {
        "id": bucket_id,
        "private": True,
        "createdAt": iso_z(root.stat().st_mtime),
        "size": sum(st.st_size for st in files),
        "totalFiles": len(files),
    }


def _entry(rel: str, st: os.stat_result) -> dict[str, Any]:
    if stat.S_ISDIR(st.st_mode):
        return {"type": "directory", "path": rel, "uploadedAt": iso_z(st.st_mtime)}
    # xetHash null: anything else makes the client switch to Xet downloads, which cannot be emulated.
    ts = iso_z(st.st_mtime)
    return {"type": "file", "path": rel, "size": st.st_size, "xetHash": None, "mtime": ts, "uploadedAt": ts}


def _safe(root: Path, rel: str) -> Path | None:
    """`root/rel` if it exists with no symbolic link on the way, else None."""
    parts = [p for p in rel.split("/") if p]
    if any(p in (".", "..") for p in parts):
        return None
    current = root
    for part in parts:
        current = current / part
        if current.is_symlink() or not current.exists():
            return None
    return current


def tree(root: Path, bucket_id: str, prefix: str, recursive: bool) -> list[dict[str, Any]]:
    """Files (and, unless recursive, directories) below `prefix`; a file prefix lists that file."""
    if not root.is_dir():
        raise _not_found_bucket(bucket_id)
    prefix = prefix.strip("/")
    base = _safe(root, prefix)
    if base is None:
        return []
    if base.is_file():
        return [_entry(prefix, base.lstat())]
    if recursive:
        items = [(os.path.join(prefix, rel) if prefix else rel, st) for rel, st in _walk(base)]
        return [_entry(rel, st) for rel, st in sorted(items) if stat.S_ISREG(st.st_mode)]
    out = []
    for child in sorted(base.iterdir()):
        st = child.lstat()
        if stat.S_ISREG(st.st_mode) or stat.S_ISDIR(st.st_mode):
            out.append(_entry(f"{prefix}/{child.name}" if prefix else child.name, st))
    return out


def resolve(root: Path, bucket_id: str, rel: str) -> Path:
    if not root.is_dir():
        raise _not_found_bucket(bucket_id)
    path = _safe(root, rel)
    if path is None or not stat.S_ISREG(path.lstat().st_mode):
        raise BucketError(404, f"Entry {rel} not found in bucket {bucket_id}", "EntryNotFound")
    return path


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(start, end exclusive) of a single `bytes=a-b` / `bytes=a-` / `bytes=-n` range, else None."""
    if not header or not header.startswith("bytes=") or "," in header:
        return None
    first, _, last = header[len("bytes=") :].partition("-")
    try:
        if first == "":
            n = int(last)
            return max(0, size - n), size
        start = int(first)
        end = int(last) + 1 if last else size
    except ValueError:
        return None
    return start, min(end, size)
