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

import tempfile
from pathlib import Path

from huggingface_hub import HfApi
from huggingface_hub.hf_api import RepoFile

from graders.assets import LocalRepo, Progress, build_repos, materialize_assets, task_builders
from graders.assets.hub_files import RepoAtCommit, local_ids, remote_ids, same_files
from graders.tasks import LOCAL_ASSETS_REVISION, RepoRef


class Published(RepoAtCommit):
    """A published repo: its tag and the commit it names."""


class PublishError(RuntimeError):
    pass


def _tag_target(api: HfApi, repo_id: str, kind: str, tag: str) -> str | None:
    refs = api.list_repo_refs(repo_id, repo_type=kind)
    return next((ref.target_commit for ref in refs.tags if ref.name == tag), None)


def _target(repo: LocalRepo, namespace: str, revision: str) -> RepoRef:
    """`repo` under another namespace and tag (the local build's are the project's own)."""
    name = repo.ref.repo_id.split("/", 1)[1]
    return RepoRef(kind=repo.ref.kind, repo_id=f"{namespace}/{name}", revision=revision)


def _check_existing_tag(api: HfApi, repo: LocalRepo, target: RepoRef) -> None:
    """A tag that already exists must name exactly the files built here (checked before anything is
    uploaded, so a refusal changes nothing on the Hub)."""
    kind, repo_id, revision = target.kind, target.repo_id, target.revision
    if not api.repo_exists(repo_id, repo_type=kind) or _tag_target(api, repo_id, kind, revision) is None:
        return
    tree = api.list_repo_tree(repo_id, repo_type=kind, revision=revision, recursive=True)
    remote = remote_ids(f for f in tree if isinstance(f, RepoFile))
    if not same_files(remote, local_ids(repo.path)):
        raise PublishError(
            f"{kind} {repo_id}: tag {revision!r} already names other files than the assets built here; "
            "publish them under another --revision"
        )


def publish_repo(api: HfApi, repo: LocalRepo, target: RepoRef) -> Published:
    kind, repo_id, revision = target.kind, target.repo_id, target.revision
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
    repos = materialize_assets(assets_dir, progress=say)
    return _publish_all(api or HfApi(), [(repo, _target(repo, namespace, revision)) for repo in repos], say)


def publish_task(task: str, *, api: HfApi | None = None, progress: Progress | None = None) -> list[Published]:
    """The repos of one task that its plugin builds, each to the repo and revision the task pins
    (e.g. a benchmark republished in the splits the task mounts), built afresh: a builder may read an
    upstream repo at its own pinned revision."""
    say: Progress = progress if progress is not None else (lambda _message: None)
    with tempfile.TemporaryDirectory(prefix=f"publish-{task}-") as scratch:
        repos = build_repos(task_builders(task), Path(scratch), progress=say)
        return _publish_all(api or HfApi(), [(repo, repo.ref) for repo in repos], say)


def _publish_all(api: HfApi, targets: list[tuple[LocalRepo, RepoRef]], say: Progress) -> list[Published]:
    for repo, target in targets:
        _check_existing_tag(api, repo, target)
    published = []
    for repo, target in targets:
        result = publish_repo(api, repo, target)
        say(f"published {result.kind} {result.repo_id}@{result.revision} ({result.commit})")
        published.append(result)
    return published
