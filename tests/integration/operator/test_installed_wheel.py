"""The product as a user installs it: the wheel built from this checkout, `pip install`ed with the
`operator` extra into a clean virtualenv (no checkout on its path), runs the operator against the
devstack: an Episode it never saw before reaches Running, and a job is admitted and settled."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from devstack.toolchain.paths import cache_root
from tests.helpers import Kubectl
from tests.integration.support import (
    REPO,
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    wait_phase,
)

pytestmark = pytest.mark.timeout(900)


def _uv() -> str:
    """The uv the Makefile installed (it made the test's own environment too); $UV overrides."""
    uv = os.environ.get("UV") or next((str(p) for p in (cache_root() / "tools").glob("uv-*/bin/uv")), "")
    if not uv:
        pytest.fail("uv not found: run `make venv`")
    return uv


def _run(*args: str, cwd: Path = REPO) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT")}
    proc = subprocess.run(args, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    assert proc.returncode == 0, f"{' '.join(args)}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed_operator(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A clean venv holding only the wheel and its `operator` extra, at the lock file's versions."""
    root = tmp_path_factory.mktemp("wheel")
    uv = _uv()
    _run(uv, "build", "--wheel", "--out-dir", str(root / "dist"))
    (wheel,) = (root / "dist").glob("posttrain_operator-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("devstack/")], "the devstack is not part of the product"
    assert {"posttrain_operator/handlers.py", "env_gateway/main.py", "graders/tasks.py"} <= set(names)
    assert any(n.endswith("licenses/LICENSE") for n in names), names
    pins = root / "pins.txt"
    _run(uv, "export", "--locked", "--extra", "operator", "--no-dev", "--no-emit-project",
         "--no-hashes", "--output-file", str(pins))  # fmt: skip
    venv = root / "venv"
    _run(uv, "venv", "--python", sys.executable, str(venv))
    python = venv / "bin" / "python"
    _run(uv, "pip", "install", "--python", str(python), "--constraint", str(pins), f"{wheel}[operator]")
    return python


def test_the_installed_wheel_runs_the_operator(
    installed_operator: Path,
    cluster: devcluster.ClusterState,
    crds: None,
    emulator: HfEmulator,
    kubectl: Kubectl,
    namespace: str,
    tmp_path: Path,
) -> None:
    # The venv has no torch, no gateway dependencies, and sees nothing of this checkout.
    probe = (
        "import importlib.util as u; print([m for m in ('torch', 'fastapi', 'devstack') if u.find_spec(m)])"
    )
    assert _run(str(installed_operator), "-c", probe, cwd=tmp_path).strip() == "[]"
    where = _run(
        str(installed_operator), "-c", "import posttrain_operator; print(posttrain_operator.__file__)"
    )
    assert str(installed_operator.parent.parent) in where, where
    operator = OperatorProcess(
        cluster, emulator, tmp_path, namespace, python=str(installed_operator), cwd=tmp_path
    )
    operator.start()
    try:
        apply(kubectl, namespace, episode_manifest("ep1", budget="0.50"))
        wait_phase(kubectl, namespace, "episode", "ep1", {"Running"}, timeout=180)
        apply(kubectl, namespace, agentjob_manifest("job1", "ep1", timeoutSeconds=600))
        job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded"}, timeout=180)
        assert job["status"]["backendJobId"] in emulator.job_ids()
        assert job["status"]["settledMicroUSD"] > 0
    finally:
        operator.stop()
        sys.stderr.write(operator.logs()[-4000:])
