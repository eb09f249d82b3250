"""Local stand-ins for Hub model/dataset repositories, mounted read-only into jobs.

A repository's trees come from host directories (`register`: `POST /_emulator/repos`, `--repo`) or
from commits made through the Hub's API (`hub_repos.py`), each commit a whole tree of its own.

The store directory is mode 0700: jobs run under the launcher, which drops to uid 10000, and must not
be able to browse repositories other than those mounted into them. Files are root-owned (when the
emulator runs as root) and read-only; each job gets hard links (or copies across file systems) laid
out at its mount paths, so a job can neither change a repository nor see another's.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import stat
import threading
from collections.abc import Sequence
from pathlib import Path

from devstack.sandbox.trees import make_read_only, make_writable, remove_tree

__all__ = ["REPO_KINDS", "RepoNotFound", "RepoStore", "make_read_only", "remove_tree"]

REPO_KINDS = ("model", "dataset", "space")


class RepoNotFound(LookupError):
    pass


class RepoStore:
    """Repositories registered by (kind, repo_id, revision), copied into `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        root.chmod(0o700)
        self._lock = threading.Lock()
        self._repos: dict[tuple[str, str, str], Path] = {}

    @staticmethod
    def _key(kind: str, repo_id: str, revision: str | None) -> tuple[str, str, str]:
        if kind not in REPO_KINDS:
            raise ValueError(f"kind must be one of {REPO_KINDS}, not {kind!r}")
        return kind, repo_id, revision or "main"

    def register(self, kind: str, repo_id: str, revision: str | None, source_dir: Path | str) -> Path:
        """Copy `source_dir` into the store as `kind` repository `repo_id` at `revision` (default main).

        Registering the same key again replaces the content (jobs already started keep their links).
        """
        key = self._key(kind, repo_id, revision)
        source = Path(source_dir)
        if not source.is_dir():
            raise NotADirectoryError(source)
        digest = hashlib.sha256("\0".join(key).encode()).hexdigest()[:16]
        target = self.root / kind / digest
        staging = self.root / kind / f".{digest}.tmp"
        staging.parent.mkdir(parents=True, exist_ok=True)
        remove_tree(staging)
        shutil.copytree(source, staging, symlinks=False)
        make_read_only(staging)
        with self._lock:
            remove_tree(target)
            staging.rename(target)
            self._repos[key] = target
        return target

    def staging_dir(self, kind: str) -> Path:
        """A fresh directory inside the store (so jobs cannot see it) to build a tree for `add_tree`."""
        self._key(kind, "", None)
        path = self.root / kind / f".staging-{secrets.token_hex(8)}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.mkdir(mode=0o700)
        return path

    def stage_copy(self, kind: str, repo_id: str, revision: str) -> Path:
        """A staging dir holding `revision`'s tree to build the next one in: its folders writable,
        its files hard links to the stored ones, so a file is replaced, never written."""
        source = self.lookup(kind, repo_id, revision)
        staging = self.staging_dir(kind)
        try:
            shutil.copytree(source, staging, dirs_exist_ok=True, copy_function=_link_or_copy)
            make_writable(staging)
        except BaseException:
            remove_tree(staging)
            raise
        return staging

    def add_tree(self, kind: str, repo_id: str, revisions: Sequence[str], staging: Path) -> Path:
        """Move `staging` (from `staging_dir`) into the store, read-only, as `repo_id` at each of
        `revisions` (one tree, several names: a commit id and the branch it is the head of)."""
        keys = [self._key(kind, repo_id, r) for r in revisions]
        digest = hashlib.sha256("\0".join(keys[0]).encode()).hexdigest()[:16]
        target = self.root / kind / digest
        make_read_only(staging)
        with self._lock:
            remove_tree(target)
            staging.rename(target)
            for key in keys:
                self._repos[key] = target
        return target

    def alias(self, kind: str, repo_id: str, revision: str, existing: str) -> None:
        """Register the tree of `existing` under `revision` too (a tag, or a branch moved to it)."""
        path = self.lookup(kind, repo_id, existing)
        with self._lock:
            self._repos[self._key(kind, repo_id, revision)] = path

    def knows(self, kind: str, repo_id: str) -> bool:
        """Whether any revision of `repo_id` is registered."""
        with self._lock:
            return any(k[:2] == (kind, repo_id) for k in self._repos)

    def lookup(self, kind: str, repo_id: str, revision: str | None) -> Path:
        key = self._key(kind, repo_id, revision)
        with self._lock:
            path = self._repos.get(key)
        if path is None:
            raise RepoNotFound(f"{kind} {repo_id}@{key[2]} is not registered in the emulator's repo store")
        return path

    def registered(self) -> list[tuple[str, str, str]]:
        with self._lock:
            return sorted(self._repos)

    def materialize(
        self, kind: str, repo_id: str, revision: str | None, subpath: str | None, dest: Path
    ) -> None:
        """Lay out the repository (or its sub-folder `subpath`) read-only at `dest`."""
        source = self.lookup(kind, repo_id, revision)
        if subpath:
            source = source / subpath
            if not source.is_dir():
                raise RepoNotFound(f"{kind} {repo_id} has no folder {subpath!r}")
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copytree(source, dest, copy_function=_link_or_copy)
        make_read_only(dest)


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)
        os.chmod(dst, stat.S_IRUSR | stat.S_IRGRP | stat.S_IROTH)
