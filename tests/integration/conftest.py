"""Integration fixtures shared by every component: CRDs on the devstack cluster, an HF Jobs emulator,
and the operator as a real `kopf run` process that tests can SIGKILL and restart."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from posttrain_launcher.host import job_interpreter

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree
from graders.assets import LocalRepo, materialize_assets
from tests.helpers import Kubectl
from tests.integration.support import (
    OperatorProcess,
    install_crds,
    job_python,  # noqa: F401 (a fixture for every integration test)
    make_emulator,
    register_placeholder_repos,
    running_operator,
)


@pytest.fixture(scope="session")
def crds(kubectl: Kubectl) -> None:
    install_crds(kubectl)


@pytest.fixture(scope="session")
def task_assets() -> list[LocalRepo]:
    """The tasks' real repos (tiny model, datasets, splits), built once and cached across runs."""
    return materialize_assets()


@pytest.fixture
def executing_emulator(request: pytest.FixtureRequest, task_assets: list[LocalRepo]) -> Iterator[HfEmulator]:
    """An emulator that really runs every job under the launcher, with the tasks' real repos.

    An indirect parameter gives it more keyword arguments (e.g. `max_job_memory_bytes`)."""
    options: dict[str, Any] = dict(getattr(request, "param", {}))
    data_dir = Path(tempfile.mkdtemp(prefix="hf-emulator-"))
    data_dir.chmod(0o711)
    (data_dir / "interpreter").mkdir(mode=0o755)
    interpreter = job_interpreter(str(data_dir / "interpreter"))
    emu, _ = make_emulator(data_dir=data_dir, interpreter=interpreter, **options)
    for repo in task_assets:
        emu.repos.register(repo.ref.kind, repo.ref.repo_id, repo.ref.revision, repo.path)
    yield emu
    emu.stop()
    remove_tree(data_dir)


@pytest.fixture
def emulator(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[HfEmulator]:
    """An emulator that runs no processes: every job 'runs' for 2 s (or the indirect parameter)."""
    runtime = float(getattr(request, "param", 2.0))
    emu, data_dir = make_emulator(execute=False, simulated_runtime=runtime)
    register_placeholder_repos(emu, tmp_path / "repos")
    yield emu
    emu.stop()
    remove_tree(data_dir)


@pytest.fixture
def operator(
    cluster: devcluster.ClusterState, crds: None, emulator: HfEmulator, tmp_path: Path, namespace: str
) -> Iterator[OperatorProcess]:
    """The operator against an emulator whose jobs run no process (fast lifecycle tests)."""
    with running_operator(cluster, emulator, tmp_path, namespace) as op:
        yield op


@pytest.fixture
def executing_operator(
    cluster: devcluster.ClusterState,
    crds: None,
    executing_emulator: HfEmulator,
    tmp_path: Path,
    namespace: str,
) -> Iterator[OperatorProcess]:
    """The operator against an emulator that runs every job for real under the launcher."""
    with running_operator(cluster, executing_emulator, tmp_path, namespace) as op:
        yield op
