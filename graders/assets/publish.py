"""Publish the tasks' repos to a Hub: `python -m graders.assets publish --namespace ORG [--revision R]`.

Each repo the registered tasks reference is built (or reused) as for the emulator, uploaded with the
real `huggingface_hub` client to `ORG/<name>` as a private repo (the hidden splits must never be
public), and tagged `R`; the chart then names `ORG` and `R` (`tasks.assetsNamespace`,
`tasks.assetsRevision`). Publishing again uploads nothing new and leaves the tags where they are; a
tag that already names other files is refused before anything is uploaded, and never moved, so a
revision always means one content.
The endpoint and the token are huggingface_hub's own: HF_ENDPOINT and HF_TOKEN (or its login).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile

from graders.assets import LocalRepo, Progress, materialize_assets
from graders.tasks import LOCAL_ASSETS_REVISION


@dataclass(frozen=True)
class Published:
    kind: str
    repo_id: str
    revision: str
    commit: str


class PublishError(RuntimeError):
    pass


def _tag_target(api: HfApi, repo_id: str, kind: str, tag: str) -> str | None:
    refs = api.list_repo_refs(repo_id, repo_type=kind)
    return next((ref.target_commit for ref in refs.tags if ref.name == tag), None)


def _target(repo: LocalRepo, namespace: str) -> str:
    return f"{namespace}/{repo.ref.repo_id.split('/', 1)[1]}"


def _local_ids(root: Path) -> dict[str, tuple[str, str]]:
    """Each file's (git blob id, sha256): what the Hub lists for a regular file and for an LFS one."""
    ids = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        data = path.read_bytes()
        blob = hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()
        ids[str(path.relative_to(root))] = (blob, hashlib.sha256(data).hexdigest())
    return ids


def _check_existing_tag(api: HfApi, repo: LocalRepo, namespace: str, revision: str) -> None:
    """A tag that already exists must name exactly the files built here (checked before anything is
    uploaded, so a refusal changes nothing on the Hub)."""
    kind, repo_id = repo.ref.kind, _target(repo, namespace)
    if not api.repo_exists(repo_id, repo_type=kind) or _tag_target(api, repo_id, kind, revision) is None:
        return
    tree = api.list_repo_tree(repo_id, repo_type=kind, revision=revision, recursive=True)
    remote = {
        f.path: f.lfs.sha256 if f.lfs else f.blob_id
        for f in tree
        if isinstance(f, RepoFile) and f.path != ".gitattributes"
    }
    local = _local_ids(repo.path)
    if set(remote) != set(local) or any(remote[p] not in local[p] for p in remote):
        raise PublishError(
            f"{kind} {repo_id}: tag {revision!r} already names other files than the assets built here; "
            "publish them under another --revision"
        )


def publish_repo(api: HfApi, repo: LocalRepo, namespace: str, revision: str) -> Published:
    kind = repo.ref.kind
    repo_id = _target(repo, namespace)
    api.create_repo(repo_id, repo_type=kind, private=True, exist_ok=True)
    commit = api.upload_folder(
        repo_id=repo_id,
        repo_type=kind,
        folder_path=repo.path,
        commit_message=f"posttrain-operator task assets ({LOCAL_ASSETS_REVISION})",
        delete_patterns=["*"],  # the revision holds exactly the built files (but .gitattributes)
    )
    tagged = _tag_target(api, repo_id, kind, revision)
    if tagged is None:
        api.create_tag(repo_id, tag=revision, repo_type=kind, revision=commit.oid)
    elif tagged != commit.oid:
        raise PublishError(
            f"{kind} {repo_id}: tag {revision!r} names commit {tagged}, not the assets just built "
            f"({commit.oid}); publish them under another --revision"
        )
    return Published(kind=kind, repo_id=repo_id, revision=revision, commit=commit.oid)


def publish(
    namespace: str,
    revision: str,
    *,
    api: HfApi | None = None,
    assets_dir: Path | None = None,
    progress: Progress | None = None,
) -> list[Published]:
    say: Progress = progress if progress is not None else (lambda _message: None)
    client = api if api is not None else HfApi()
    repos = materialize_assets(assets_dir, progress=say)
    for repo in repos:
        _check_existing_tag(client, repo, namespace, revision)
    published = []
    for repo in repos:
        result = publish_repo(client, repo, namespace, revision)
        say(f"published {result.kind} {result.repo_id}@{result.revision} ({result.commit})")
        published.append(result)
    return published
