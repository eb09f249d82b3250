"""Local stand-ins for the Hub repos the tasks pin, built deterministically by the project.

No model hub is reachable from our machines, so `materialize_assets()` builds every repo the registry
references under a cache dir and returns where each one is, for the HF Jobs emulator's repo store and
for tests. Importing this package does not import torch; only building the base model does.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from graders.assets import datasets
from graders.tasks import LOCAL_ASSETS_REVISION, RepoRef, all_tasks, get_task

Progress = Callable[[str], None]


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
    """Every repo any task references (base models, agent datasets, dev and hidden splits), once."""
    refs: list[RepoRef] = []
    for task in all_tasks():
        candidates = [task.base_model, *task.agent_datasets.values(), task.dev_split, task.hidden_split]
        refs.extend(ref for ref in candidates if ref is not None and ref not in refs)
    return refs


def _build_base_model(path: Path, progress: Progress) -> None:
    # Takes effect only if torch is not loaded yet: spinning OpenMP threads starve each other on a
    # shared CPU (passive waiting measured 3-5x faster on a busy 2-core machine).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from graders.assets.tiny_model import pretrain_base_model  # torch is needed only here

    pretrain_base_model(path, progress=progress)


def _dataset_builder(records: Callable[[], list[dict[str, object]]]) -> Callable[[Path, Progress], None]:
    def build(path: Path, progress: Progress) -> None:
        datasets.write_dataset_repo(path, records())

    return build


def _builders() -> dict[RepoRef, Callable[[Path, Progress], None]]:
    arithmetic = get_task("t0_arithmetic_format")
    artifact = get_task("t0_artifact")
    assert arithmetic.base_model is not None
    return {
        arithmetic.base_model: _build_base_model,
        arithmetic.agent_datasets["train"]: _dataset_builder(lambda: datasets.arithmetic_splits()["train"]),
        arithmetic.dev_split: _dataset_builder(lambda: datasets.arithmetic_splits()["dev"]),
        arithmetic.hidden_split: _dataset_builder(lambda: datasets.arithmetic_splits()["hidden"]),
        artifact.agent_datasets["records"]: _dataset_builder(datasets.artifact_records),
        artifact.dev_split: _dataset_builder(lambda: datasets.artifact_checks()["dev"]),
        artifact.hidden_split: _dataset_builder(lambda: datasets.artifact_checks()["hidden"]),
    }


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
    """Build (or reuse) every repo the tasks reference; returns them in registry order.

    A repo dir only ever appears complete: it is built in a scratch dir and renamed into place.
    """
    root = assets_dir if assets_dir is not None else default_assets_dir()
    say: Progress = progress if progress is not None else (lambda _message: None)
    builders = _builders()
    repos = [LocalRepo(ref=ref, path=repo_path(root, ref)) for ref in referenced_repos()]
    missing = [repo.ref for repo in repos if repo.ref not in builders]
    if missing:
        raise RuntimeError(f"no local builder for {missing}")
    if all(repo.path.is_dir() for repo in repos):
        return repos
    with _exclusive(root / ".lock"):
        for repo in repos:
            if repo.path.is_dir():
                say(f"cached   {repo.ref.kind} {repo.ref.repo_id}@{repo.ref.revision}")
                continue
            say(f"building {repo.ref.kind} {repo.ref.repo_id}@{repo.ref.revision}")
            started = time.monotonic()
            scratch = repo.path.with_name(f".{repo.path.name}.partial")
            shutil.rmtree(scratch, ignore_errors=True)
            scratch.mkdir(parents=True)
            builders[repo.ref](scratch, say)
            scratch.rename(repo.path)
            say(f"built    {repo.ref.repo_id} in {time.monotonic() - started:.1f}s")
    return repos
