"""Whether a directory holds exactly the files a Hub revision lists: by git blob id for a regular file,
by sha256 for an LFS one (what the Hub reports for each). `.gitattributes` is the Hub's, not the repo's."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub.hf_api import RepoFile, RepoSibling

HUB_ONLY = ".gitattributes"


@dataclass(frozen=True)
class RepoAtCommit:
    """A repo at a revision (a tag), and the commit the Hub has under it: what mirroring and publishing
    report of each repo."""

    kind: str
    repo_id: str
    revision: str
    commit: str


CHUNK = 1 << 20


def local_ids(root: Path) -> dict[str, tuple[str, str]]:
    """Each file's (git blob id, sha256), by its path under `root`; read in chunks (weights are GBs)."""
    ids = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        relative = str(path.relative_to(root))
        if relative == HUB_ONLY:
            continue
        blob = hashlib.sha1(b"blob %d\0" % path.stat().st_size, usedforsecurity=False)
        content = hashlib.sha256()
        with path.open("rb") as stream:
            while chunk := stream.read(CHUNK):
                blob.update(chunk)
                content.update(chunk)
        ids[relative] = (blob.hexdigest(), content.hexdigest())
    return ids


def remote_ids(entries: Iterable[RepoFile | RepoSibling]) -> dict[str, str]:
    """Each listed file's id (LFS: its sha256; else its blob id), from a tree listing or `repo_info`'s
    siblings (with `files_metadata=True`)."""
    ids = {}
    for entry in entries:
        path = entry.path if isinstance(entry, RepoFile) else entry.rfilename
        if path != HUB_ONLY:
            ids[path] = entry.lfs.sha256 if entry.lfs else str(entry.blob_id)
    return ids


def same_files(remote: dict[str, str], local: dict[str, tuple[str, str]]) -> bool:
    return set(remote) == set(local) and all(remote[path] in local[path] for path in remote)
