"""Mirror a task's repos from a Hub into the pods backend's store:
`python -m graders.assets mirror --task T --store DIR`.

Every repo the task's jobs mount (its base model, agent datasets, dev and hidden splits) is downloaded
with `snapshot_download` at the revision the task pins, into `DIR/repos/<kind>/<repo id>/<revision>`,
the layout the pods backend mounts from (operator: `backends/pods/names.py`). Each repo is checked
first, and nothing is written unless all pass: one already there with exactly the files the Hub lists
at that revision is left as it is (mirroring again downloads nothing); one with other files is
refused with its name (the revision moved under the same name, or the copy was changed).
The endpoint and the token are huggingface_hub's own: HF_ENDPOINT and HF_TOKEN (or its login).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from huggingface_hub import HfApi, snapshot_download

from graders.assets import Progress, task_repos
from graders.assets.hub_files import HUB_ONLY, RepoAtCommit, local_ids, remote_ids, same_files
from graders.tasks import RepoRef, get_task


@dataclass(frozen=True)
class Mirrored(RepoAtCommit):
    path: str
    downloaded: bool


class MirrorError(RuntimeError):
    pass


def store_path(store: Path, ref: RepoRef) -> Path:
    """Where the pods backend mounts `ref` from; refused if a part would climb out of the store."""
    parts = [ref.kind, *ref.repo_id.split("/"), ref.revision]
    if any(part in ("", ".", "..") or "/" in part for part in parts):
        raise MirrorError(f"{ref.kind} {ref.repo_id}@{ref.revision}: not a path inside the store")
    return store.joinpath("repos", *parts)


def mirror(
    task: str, store: Path, *, api: HfApi | None = None, progress: Progress | None = None
) -> list[Mirrored]:
    say: Progress = progress if progress is not None else (lambda _message: None)
    client = api if api is not None else HfApi()
    plans: list[tuple[RepoRef, str, dict[str, str]]] = []
    for ref in task_repos(get_task(task)):
        info = client.repo_info(ref.repo_id, repo_type=ref.kind, revision=ref.revision, files_metadata=True)
        remote = remote_ids(getattr(info, "siblings", None) or [])  # models and datasets list theirs
        target = store_path(store, ref)
        if target.exists() and not same_files(remote, local_ids(target)):
            raise MirrorError(
                f"{ref.kind} {ref.repo_id}@{ref.revision}: {target} holds other files than the Hub lists at "
                f"that revision (commit {info.sha}); the revision moved under the same name or the copy was "
                "changed: pin another revision, or remove that directory"
            )
        plans.append((ref, str(info.sha), remote))
    mirrored = []
    for ref, commit, remote in plans:
        target = store_path(store, ref)
        fetch = not target.exists()
        if fetch:
            say(f"mirroring {ref.kind} {ref.repo_id}@{ref.revision} ({commit})")
            _download(client, ref, commit, remote, target)
        else:
            say(f"unchanged {ref.kind} {ref.repo_id}@{ref.revision}")
        mirrored.append(Mirrored(ref.kind, ref.repo_id, ref.revision, commit, str(target), fetch))
    return mirrored


def _download(api: HfApi, ref: RepoRef, commit: str, remote: dict[str, str], target: Path) -> None:
    """Into a scratch dir beside `target`, checked against the listing, then renamed into place: a repo
    dir only ever appears complete. Readable by the jobs' uid (the store is shared with them)."""
    scratch = target.with_name(f".{target.name}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.parent.mkdir(parents=True, exist_ok=True)
    snapshot_download(
        ref.repo_id,
        repo_type=ref.kind,
        revision=commit,
        local_dir=scratch,
        endpoint=api.endpoint,
        token=api.token,
    )
    shutil.rmtree(scratch / ".cache", ignore_errors=True)  # the client's download bookkeeping
    (scratch / HUB_ONLY).unlink(missing_ok=True)
    if not same_files(remote, local_ids(scratch)):
        shutil.rmtree(scratch)
        raise MirrorError(f"{ref.kind} {ref.repo_id}@{commit}: the download does not match the Hub's listing")
    for directory, _, files in os.walk(scratch):
        Path(directory).chmod(0o755)
        for name in files:
            Path(directory, name).chmod(0o644)
    scratch.rename(target)
