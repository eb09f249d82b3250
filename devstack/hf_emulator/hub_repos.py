"""Repositories written through the Hub's API: commits, branches and tags over the `RepoStore`.

Every commit is a complete tree in the store, registered under its commit id; the branch it heads
and every tag naming it are more names for that same tree, so a job volume at `repo@<tag>` or
`repo@<commit>` mounts exactly that commit's files. A commit's tree is built in a staging dir
inside the store, from hard links to its parent's files (never written in place: a changed file is
a new inode) plus the commit's own files, and registered only once complete: a refused commit
leaves nothing behind.
"""

from __future__ import annotations

import hashlib
import itertools
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from devstack.hf_emulator.errors import ApiError
from devstack.hf_emulator.repos import RepoStore, remove_tree
from devstack.hf_emulator.validation import SpecError

DEFAULT_BRANCH = "main"
MAX_REPO_FILES = 100_000
# What the Hub writes as a new repo's initial commit (abridged: the Hub's list is longer).
_LFS_PATTERNS = """
*.7z *.arrow *.bin *.bz2 *.ckpt *.gz *.h5 *.joblib *.msgpack *.npy *.npz *.onnx *.parquet *.pickle
*.pkl *.pt *.pth *.safetensors *.tar *.tgz *.xz *.zip *.zst *tfevents*
"""
GITATTRIBUTES = "".join(f"{p} filter=lfs diff=lfs merge=lfs -text\n" for p in _LFS_PATTERNS.split())


def hub_error(status: int, message: str, code: str | None = None) -> ApiError:
    """An error as the Hub sends it: the client reads X-Error-Code to pick its exception class."""
    headers = {"X-Error-Message": message}
    if code is not None:
        headers["X-Error-Code"] = code
    return ApiError(status, message, headers)


def git_blob_id(content: bytes) -> str:
    """The git blob id, which the Hub reports as a file's oid and the client compares to skip
    unchanged files."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content, usedforsecurity=False).hexdigest()


@dataclass(frozen=True)
class FileEntry:
    size: int
    oid: str


@dataclass(frozen=True)
class Commit:
    oid: str
    parent: str | None
    summary: str
    at: float
    files: dict[str, FileEntry]


@dataclass
class HubRepo:
    kind: str
    repo_id: str
    private: bool
    created_at: float
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    commits: dict[str, Commit] = field(default_factory=dict)
    # Held across a commit or a tag: commits to one repo apply one after another, each on the last.
    lock: threading.Lock = field(default_factory=threading.Lock)

    def resolve(self, revision: str) -> Commit:
        oid = self.branches.get(revision) or self.tags.get(revision) or revision
        commit = self.commits.get(oid)
        if commit is None:
            raise hub_error(404, f"Invalid rev id: {revision}", "RevisionNotFound")
        return commit


@dataclass(frozen=True)
class AddFile:
    path: str
    content: bytes


@dataclass(frozen=True)
class Delete:
    path: str
    folder: bool


Operation = AddFile | Delete


class HubRepos:
    """The repos created with `POST /api/repos/create`, by (kind, repo_id)."""

    def __init__(self, store: RepoStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._repos: dict[tuple[str, str], HubRepo] = {}
        self._seq = itertools.count()

    def get(self, kind: str, repo_id: str) -> HubRepo:
        with self._lock:
            repo = self._repos.get((kind, repo_id))
        if repo is None:
            raise hub_error(404, f"Repository {repo_id} not found", "RepoNotFound")
        return repo

    def create(self, kind: str, repo_id: str, *, private: bool) -> HubRepo:
        """A new repo whose main branch holds one commit with a `.gitattributes`, as on the Hub."""
        repo = HubRepo(kind, repo_id, private, time.time())
        staging = self.store.staging_dir(kind)
        try:
            tree = _Tree({})
            tree.add(staging, ".gitattributes", GITATTRIBUTES.encode())
            commit = self._new_commit(repo, None, "initial commit", tree.files)
            with self._lock:
                if (kind, repo_id) in self._repos:
                    raise hub_error(409, f"You already created this {kind} repo")
                if self.store.knows(kind, repo_id):
                    raise hub_error(409, f"{kind} {repo_id} is already registered from a host directory")
                self._publish(repo, DEFAULT_BRANCH, commit, staging)
                self._repos[(kind, repo_id)] = repo
        except BaseException:
            remove_tree(staging)
            raise
        return repo

    def commit(
        self,
        repo: HubRepo,
        branch: str,
        summary: str,
        parent_commit: str | None,
        operations: Iterable[Operation],
    ) -> Commit:
        """Apply `operations` (consumed as they come, so a body's files never all sit in memory)
        on the head of `branch`, making a new commit that branch then names."""
        with repo.lock:
            head = repo.branches.get(branch)
            if head is None:
                if branch in repo.tags or branch in repo.commits:
                    raise hub_error(400, f"{branch} is not a branch: commits go to a branch")
                raise hub_error(404, f"Invalid rev id: {branch}", "RevisionNotFound")
            if parent_commit is not None and parent_commit != head:
                raise hub_error(412, f"A commit has happened since {parent_commit}: {branch} is at {head}")
            parent = repo.commits[head]
            staging = self.store.stage_copy(repo.kind, repo.repo_id, parent.oid)
            try:
                tree = _Tree(dict(parent.files))
                for op in operations:
                    tree.apply(staging, op)
                if len(tree.files) > MAX_REPO_FILES:
                    raise hub_error(413, f"a repository holds at most {MAX_REPO_FILES} files")
                commit = self._new_commit(repo, head, summary, tree.files)
                self._publish(repo, branch, commit, staging)
            except BaseException:
                remove_tree(staging)
                raise
            return commit

    def tag(self, repo: HubRepo, tag: str, revision: str) -> Commit:
        with repo.lock:
            commit = repo.resolve(revision)
            if tag in repo.tags:
                raise hub_error(409, f"Tag {tag} already exists")
            if tag in repo.branches:
                raise hub_error(409, f"A branch is named {tag}")
            self.store.alias(repo.kind, repo.repo_id, tag, commit.oid)
            repo.tags[tag] = commit.oid
            return commit

    def _new_commit(
        self, repo: HubRepo, parent: str | None, summary: str, files: dict[str, FileEntry]
    ) -> Commit:
        manifest = "".join(f"{p}\0{e.oid}\n" for p, e in sorted(files.items()))
        now = time.time()
        seed = f"{repo.kind}\0{repo.repo_id}\0{parent}\0{summary}\0{now!r}\0{next(self._seq)}\0{manifest}"
        oid = hashlib.sha1(seed.encode(), usedforsecurity=False).hexdigest()
        return Commit(oid, parent, summary, now, files)

    def _publish(self, repo: HubRepo, branch: str, commit: Commit, staging: Path) -> None:
        """Register the commit's tree under its id and its branch, then make the branch name it."""
        self.store.add_tree(repo.kind, repo.repo_id, [commit.oid, branch], staging)
        repo.commits[commit.oid] = commit
        repo.branches[branch] = commit.oid


class _Tree:
    """A commit's files while it is built in `root`, with how many files each folder holds."""

    def __init__(self, files: dict[str, FileEntry]) -> None:
        self.files = files
        self.folders: Counter[str] = Counter(p for path in files for p in _parents(path))

    def add(self, root: Path, path: str, content: bytes) -> None:
        for parent in _parents(path):
            if parent in self.files:
                raise SpecError(f"cannot add {path!r}: {parent} is a file")
        if path in self.folders:
            raise SpecError(f"cannot add {path!r}: it is a folder")
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        if path in self.files:
            # The old inode may be the parent commit's (a hard link): never write into it.
            self._forget(root, path, prune=False)
        fd = os.open(root / path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(content)
        self.files[path] = FileEntry(len(content), git_blob_id(content))
        self.folders.update(_parents(path))

    def apply(self, root: Path, op: Operation) -> None:
        if isinstance(op, AddFile):
            self.add(root, op.path, op.content)
        elif op.folder:
            if op.path not in self.folders:
                raise hub_error(404, f"A folder with this name doesn't exist: {op.path}", "EntryNotFound")
            for path in [p for p in self.files if p.startswith(op.path + "/")]:
                self._forget(root, path, prune=False)
            remove_tree(root / op.path)
            self._prune(root, op.path)
        else:
            if op.path not in self.files:
                raise hub_error(404, f"A file with this name doesn't exist: {op.path}", "EntryNotFound")
            self._forget(root, op.path, prune=True)

    def _forget(self, root: Path, path: str, *, prune: bool) -> None:
        del self.files[path]
        for parent in _parents(path):
            self.folders[parent] -= 1
            if not self.folders[parent]:
                del self.folders[parent]
        (root / path).unlink(missing_ok=True)
        if prune:
            self._prune(root, path)

    def _prune(self, root: Path, path: str) -> None:
        """Remove the folders above `path` left empty: git keeps no empty folders."""
        for parent in _parents(path):
            if parent in self.folders:
                return
            (root / parent).rmdir()


def _parents(path: str) -> list[str]:
    """The folders holding `path`, innermost first: "a/b/c" -> ["a/b", "a"]."""
    parts = path.split("/")
    return ["/".join(parts[:i]) for i in range(len(parts) - 1, 0, -1)]
