"""The Hub repos the tasks pin, built deterministically by the tasks' own builders.

`materialize_assets()` builds every repo the registry references under a cache dir and returns where
each one is: for the HF Jobs emulator's repo store, for tests, and for `publish`, which uploads them
to a real Hub. Importing this package does not import torch; only building the base model does.
"""

from __future__ import annotations

import fcntl
import importlib
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from graders.tasks import LOCAL_ASSETS_REVISION, AssetLocation, RepoRef, Task, registered_task, task_names

Progress = Callable[[str], None]
AssetBuilder = Callable[[Path, Progress], None]


@dataclass(frozen=True)
class LocalRepo:
    ref: RepoRef
    path: Path


def default_assets_dir() -> Path:
    cache_home = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache_home) / "posttrain-operator" / "assets" / LOCAL_ASSETS_REVISION


def repo_path(assets_dir: Path, ref: RepoRef) -> Path:
    return assets_dir / ref.kind / ref.repo_id


def referenced_repos() -> list[RepoRef]:
    """Every repo the tasks reference at the configured location (base models, agent datasets, dev
    and hidden splits), once."""
    return list(_repo_builders())


def _repo_builders() -> dict[RepoRef, AssetBuilder | None]:
    """Each referenced repo at the configured location, in registry order, with the builder its task's
    plugin has for it (None: a bug, reported by `materialize_assets`). Repos a task pins elsewhere
    are its own to publish, and are left out."""
    location = AssetLocation()
    repos: dict[RepoRef, AssetBuilder | None] = {}
    for name in task_names():
        registered = registered_task(name)
        task = registered.task
        builders: dict[str, AssetBuilder] = {}
        if registered.plugin.assets is not None:
            builders = dict(importlib.import_module(registered.plugin.assets).BUILDERS)
        for ref in task_repos(task):
            namespace, repo_name = ref.repo_id.split("/", 1)
            if (namespace, ref.revision) != (location.namespace, location.revision):
                continue
            if repos.get(ref) is None:
                repos[ref] = builders.get(repo_name)
    return repos


@contextmanager
def _exclusive(lock_path: Path) -> Iterator[None]:
    """One builder at a time per cache dir (tests, the emulator and the CLI may race)."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def materialize_assets(
    assets_dir: Path | None = None, *, progress: Progress | None = None
) -> list[LocalRepo]:
    """Build (or reuse) every repo the tasks reference at the configured location, in registry order."""
    root = assets_dir if assets_dir is not None else default_assets_dir()
    say: Progress = progress if progress is not None else (lambda _message: None)
    builders = _repo_builders()
    repos = [LocalRepo(ref=ref, path=repo_path(root, ref)) for ref in builders]
    missing = [f"{ref.kind} {ref.repo_id}" for ref, build in builders.items() if build is None]
    if missing:
        raise RuntimeError(f"no builder for {', '.join(missing)}: its task's plugin has none")
    if all(repo.path.is_dir() for repo in repos):
        return repos
    with _exclusive(root / ".lock"):
        return build_repos({ref: build for ref, build in builders.items() if build is not None}, root, say)


def build_repos(builders: dict[RepoRef, AssetBuilder], root: Path, progress: Progress) -> list[LocalRepo]:
    """Build each repo under `root`, reusing one already there; a repo dir only ever appears complete:
    it is built in a scratch dir and renamed into place."""
    repos = []
    for ref, build in builders.items():
        repo = LocalRepo(ref=ref, path=repo_path(root, ref))
        repos.append(repo)
        if repo.path.is_dir():
            progress(f"cached   {ref.kind} {ref.repo_id}@{ref.revision}")
            continue
        progress(f"building {ref.kind} {ref.repo_id}@{ref.revision}")
        started = time.monotonic()
        scratch = repo.path.with_name(f".{repo.path.name}.partial")
        shutil.rmtree(scratch, ignore_errors=True)
        scratch.mkdir(parents=True)
        build(scratch, progress)
        scratch.rename(repo.path)
        progress(f"built    {ref.repo_id} in {time.monotonic() - started:.1f}s")
    return repos


def task_builders(name: str) -> dict[RepoRef, AssetBuilder]:
    """The repos of task `name` that its plugin builds (by repo name), wherever the task pins them."""
    registered = registered_task(name)
    if registered.plugin.assets is None:
        return {}
    builders: dict[str, AssetBuilder] = dict(importlib.import_module(registered.plugin.assets).BUILDERS)
    return {
        ref: builders[ref.repo_id.split("/", 1)[1]]
        for ref in task_repos(registered.task)
        if ref.repo_id.split("/", 1)[1] in builders
    }


def task_repos(task: Task) -> list[RepoRef]:
    """Every repo a task's jobs mount (its base model, agent datasets, dev and hidden splits), once."""
    refs = [task.base_model, *task.agent_datasets.values(), task.dev_split, task.hidden_split]
    return list(dict.fromkeys(ref for ref in refs if ref is not None))
