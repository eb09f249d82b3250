"""What the integration tests share: the operator as a real `kopf run` process, an HF Jobs emulator
with the task assets, manifests and waits, and the job interpreter fixture (conftest re-exports it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from posttrain_launcher.host import job_interpreter

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from devstack.operator_env import operator_env
from devstack.sandbox.trees import remove_tree
from graders.tasks import all_tasks
from tests.helpers import Kubectl, kubectl_json, wait_for


@pytest.fixture(scope="session")
def job_python() -> Iterator[str]:
    """An interpreter uid 10000 can run: as root, the launcher drops to that uid and execs the job
    with its own interpreter; `job_interpreter` builds one if this one is not. Not under pytest's
    tmp_path, which is private to root: the job's uid must reach the interpreter."""
    workdir = Path(tempfile.mkdtemp(prefix="posttrain-job-python-"))
    workdir.chmod(0o755)
    try:
        yield job_interpreter(str(workdir))
    finally:
        remove_tree(workdir)


REPO = Path(__file__).resolve().parents[2]


HF_TOKEN = "hf_operator_test_token_0123456789"


HF_NAMESPACE = "posttrain-dev"


BUCKET = f"{HF_NAMESPACE}/posttrain-outputs"


# The identity the operator's broker API lets in, as the chart would set it for the gateway.
BROKER_NAMESPACE = "posttrain-system"


def install_crds(kubectl: Kubectl) -> None:
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    for crd in ("episodes.posttrain.dev", "agentjobs.posttrain.dev", "budgetquotas.posttrain.dev"):
        # Right after the apply the CRD may have no conditions yet, which `kubectl wait` calls an error.
        wait_for(
            lambda crd=crd: kubectl("wait", "--for=condition=Established", f"crd/{crd}", "--timeout=30s",
                                    check=False).returncode == 0,
            timeout=60, what=f"{crd} to be Established",
        )  # fmt: skip


def make_emulator(data_dir: Path | None = None, **kwargs: Any) -> tuple[HfEmulator, Path]:
    # Not tmp_path: pytest's base temp dir is 0700 and the launcher (uid 10000) must reach job trees.
    if data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="hf-emulator-"))
        data_dir.chmod(0o711)
    emulator = HfEmulator(data_dir, token=HF_TOKEN, namespace=HF_NAMESPACE, **kwargs).start()
    emulator.create_bucket(BUCKET)
    return emulator, data_dir


def register_placeholder_repos(emulator: HfEmulator, root: Path) -> None:
    """Every repo the tasks name, as an empty directory: enough for jobs that run no process."""
    for task in all_tasks():
        refs = [task.base_model, task.dev_split, task.hidden_split, *task.agent_datasets.values()]
        for ref in filter(None, refs):
            source = root / ref.kind / ref.repo_id
            source.mkdir(parents=True, exist_ok=True)
            emulator.repos.register(ref.kind, ref.repo_id, ref.revision, source)


class OperatorProcess:
    """`kopf run` against the devstack cluster and an emulator, as a killable child process."""

    def __init__(
        self,
        cluster: devcluster.ClusterState,
        emulator: HfEmulator,
        log_dir: Path,
        namespace: str,
        *,
        python: str = sys.executable,
        cwd: Path = REPO,
        **env: str,
    ) -> None:
        # Scoped to the test's namespace: tests (and people) sharing a cluster never cross-talk.
        self.namespace = namespace
        self.python, self.cwd = python, cwd  # another environment: an installed wheel's
        self.cluster = cluster
        self.emulator = emulator
        self.log_dir = log_dir
        self.extra_env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.starts = 0
        self.broker_port = devcluster.free_port()
        self.metrics_port = devcluster.free_port(avoid={self.broker_port})

    @property
    def broker_url(self) -> str:
        return f"http://127.0.0.1:{self.broker_port}"

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    def env(self) -> dict[str, str]:
        settings = {
            "HF_HOME": str(self.log_dir / "hf-home"),
            "POSTTRAIN_HF_HTTP_TIMEOUT_SECONDS": "3",
            "POSTTRAIN_POLL_INTERVAL_SECONDS": "0.5",
            "POSTTRAIN_EPISODE_TICK_SECONDS": "0.5",
            "POSTTRAIN_ORPHAN_RETRY_INITIAL_SECONDS": "1",
            "POSTTRAIN_ORPHAN_RETRY_MAX_SECONDS": "4",
            **self.extra_env,
        }
        return operator_env(
            os.environ,
            kubeconfig=self.cluster.kubeconfig,
            hf_endpoint=self.emulator.url,
            hf_token=HF_TOKEN,
            hf_namespace=HF_NAMESPACE,
            hf_bucket=BUCKET,
            broker_port=self.broker_port,
            metrics_port=self.metrics_port,
            broker_allowed_users=[f"system:serviceaccount:{BROKER_NAMESPACE}:gateway"],
            **settings,
        )

    def start(self) -> OperatorProcess:
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [
                self.python, "-m", "kopf", "run", "--standalone", f"--namespace={self.namespace}",
                "-m", "posttrain_operator.handlers",
            ],
            env=self.env(),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.cwd,
        )  # fmt: skip
        return self

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Until start-up has finished (the broker listens), so a kill lands in real work."""
        wait_for(lambda: "broker API listening" in self.current_log(), timeout=timeout,
                 what="the operator to start")  # fmt: skip

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(timeout=10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def current_log(self) -> str:
        """What the process started last has logged so far."""
        return (self.log_dir / f"operator-{self.starts}.log").read_text(errors="replace")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace") for p in sorted(self.log_dir.glob("operator-*.log")))


@contextlib.contextmanager
def running_operator(
    cluster: devcluster.ClusterState, emulator: HfEmulator, log_dir: Path, namespace: str, **env: str
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(cluster, emulator, log_dir, namespace, **env).start()
    try:
        yield op
    finally:
        op.stop()
        # Captured, so pytest shows it only when the test failed.
        sys.stderr.write(op.logs()[-8000:])


def episode_manifest(
    name: str, task: str = "t0_artifact", budget: str = "1.00", **spec: Any
) -> dict[str, Any]:
    return {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "Episode",
        "metadata": {"name": name},
        "spec": {"task": task, "budgetUSD": budget, "backend": "hf-jobs", **spec},
    }


def agentjob_manifest(name: str, episode: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "episode": episode,
        "purpose": "train",
        "script": "print('hello')",
        "flavor": "cpu-basic",
        "timeoutSeconds": 600,
    }
    base.update(spec)
    return {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "AgentJob",
        "metadata": {"name": name},
        "spec": base,
    }


def apply(kubectl: Kubectl, namespace: str, *manifests: dict[str, Any]) -> None:
    kubectl("-n", namespace, "apply", "-f", "-", input=yaml.safe_dump_all(manifests))


def get(kubectl: Kubectl, namespace: str, kind: str, name: str) -> dict[str, Any]:
    result: dict[str, Any] = kubectl_json(kubectl, "-n", namespace, "get", kind, name)
    return result


def wait_phase(
    kubectl: Kubectl, namespace: str, kind: str, name: str, phases: set[str], timeout: float = 60.0
) -> dict[str, Any]:
    def reached() -> dict[str, Any] | None:
        obj = get(kubectl, namespace, kind, name)
        return obj if obj.get("status", {}).get("phase") in phases else None

    result: dict[str, Any] = wait_for(reached, timeout=timeout, what=f"{kind}/{name} to reach {phases}")
    return result
