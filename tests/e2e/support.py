"""E2E test helpers: the kind cluster and chart release the session made, the chart's values, and
how the tests reach into the cluster (port-forwards, probe pods)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.kind import seccomp
from graders.assets import LocalRepo, materialize_assets
from tests.gsm8k_standin import SETTINGS as GSM8K_STANDIN
from tests.gsm8k_standin import standin_registry
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]


CHART = REPO / "helm" / "posttrain-operator"


CLUSTER_NAME = os.environ.get("E2E_CLUSTER_NAME", "posttrain-e2e")


RELEASE = "pt"


NAMESPACE = "posttrain-e2e"


HF_TOKEN = "hf_e2e_test_token_0123456789"


HF_NAMESPACE = "posttrain-e2e"


BUCKET = f"{HF_NAMESPACE}/posttrain-outputs"


FULLNAME = f"{RELEASE}-posttrain-operator"


OPERATOR_DEPLOYMENT = f"{FULLNAME}-operator"


GATEWAY_DEPLOYMENT = f"{FULLNAME}-gateway"


GATEWAY_SERVICE = f"{FULLNAME}-gateway"


# The pods backend's artifact store on kind: a directory of this machine, mounted into the node, that
# the chart's hostPath volume names; the tests place the task repos in it and read job outputs.
STORE_IN_NODE = "/var/lib/posttrain-store"


JOB_UID = 10000


# On a one-node cluster of two cores, the control plane already requests about one: ask for less.
# "held" pods stay Pending until a test labels the node: what lets a test act between the pod's
# creation and its start.
HOLD_LABEL = "posttrain.dev/e2e-hold"


POD_FLAVORS: dict[str, dict[str, Any]] = {
    "cpu-basic": {
        "cpu": "2",
        "cpuRequest": "250m",
        "memory": "4Gi",
        "shmSize": "768Mi",
        "priceMicroUSDPerMinute": 167,
    },
    # The trl task's grader flavor (a bigger one on a real cluster; this node has 2 cores).
    "cpu-upgrade": {
        "cpu": "2",
        "cpuRequest": "250m",
        "memory": "4Gi",
        "priceMicroUSDPerMinute": 500,
    },
    "held": {
        "cpu": "1",
        "cpuRequest": "100m",
        "memory": "1Gi",
        "priceMicroUSDPerMinute": 167,
        "nodeSelector": {HOLD_LABEL: "released"},
    },
}


# The pods tests run once per job runtime: the node's default (runc), then gVisor's runsc through the
# RuntimeClass the chart installs and every flavor naming it (the platform's choice, per flavor).
JOB_RUNTIMES = ("runc", "gvisor")


GVISOR_CLASS = {
    "name": "gvisor",
    "handler": "runsc",
    # The sandbox's own memory (its kernel, the gofer) is charged to the pod: the scheduler counts it.
    "overhead": {"podFixed": {"cpu": "50m", "memory": "128Mi"}},
}


# A RuntimeClass whose handler no node has: its pods can never start.
ABSENT_CLASS = {"name": "absent", "handler": "absent"}


# Flavors that keep their runtime in both passes: gVisor beside runc in one run (bench/pod_start.py),
# and one naming the absent class.
FIXED_RUNTIME_FLAVORS: dict[str, dict[str, Any]] = {
    "cpu-gvisor": {**POD_FLAVORS["cpu-basic"], "runtimeClassName": GVISOR_CLASS["name"]},
    "cpu-absent-runtime": {
        "cpu": "1",
        "cpuRequest": "100m",
        "memory": "1Gi",
        "priceMicroUSDPerMinute": 167,
        "runtimeClassName": ABSENT_CLASS["name"],
    },
}


def say(config: pytest.Config, text: str) -> None:
    """Print past pytest's capture: what `make e2e` must show (nodes, pods, helm test, reward)."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
        print(text, flush=True)


@dataclass
class Cluster:
    kubeconfig: Path
    is_kind: bool
    bin_dir: Path
    store_dir: Path | None = None  # the pods backend's store, as this machine sees it (kind only)

    def run(
        self, tool: str, *args: str, input: str | None = None, timeout: float = 120
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.bin_dir / tool), f"--kubeconfig={self.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=timeout,
        )

    def kubectl(self, *args: str, input: str | None = None, check: bool = True, timeout: float = 120) -> str:
        proc = self.run("kubectl", *args, input=input, timeout=timeout)
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr.strip()}")
        return proc.stdout

    def json(self, *args: str) -> Any:
        return json.loads(self.kubectl(*args, "-o", "json"))

    def helm(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
        return self.run("helm", *args, timeout=timeout)


@dataclass
class Release:
    cluster: Cluster
    namespace: str
    orchestrator_token: str
    operator_image: str
    install_seconds: float
    values: dict[str, Any]
    job_runtime: str = "runc"

    def kubectl(self, *args: str, **kwargs: Any) -> str:
        return self.cluster.kubectl("-n", self.namespace, *args, **kwargs)

    def json(self, *args: str) -> Any:
        return self.cluster.json("-n", self.namespace, *args)

    def pods(self, component: str) -> list[dict[str, Any]]:
        selector = f"app.kubernetes.io/component={component},app.kubernetes.io/instance={RELEASE}"
        return list(self.json("get", "pods", "-l", selector)["items"])

    def ready_pod(self, component: str) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            for pod in self.pods(component):
                if pod["metadata"].get("deletionTimestamp"):
                    continue
                conditions = {c["type"]: c["status"] for c in pod["status"].get("conditions", [])}
                if conditions.get("Ready") == "True":
                    return pod
            return None

        pod: dict[str, Any] = wait_for(ready, timeout=300, interval=1, what=f"a Ready {component} pod")
        return pod


def stage_store(store: Path, repos: list[LocalRepo] | None = None) -> None:
    """The store's layout (backends/pods/names.py): every task repo (or `repos`) read-only under
    `repos/`, and `outputs/` and `wheels/`, where the operator (uid 10000) makes each job's output dir
    and stages its packages."""
    if repos is None:
        with standin_registry():
            repos = materialize_assets()
    for repo in repos:
        target = store / "repos" / repo.ref.kind / repo.ref.repo_id / repo.ref.revision
        if not target.exists():
            shutil.copytree(repo.path, target)
    # Readable by the jobs' uid 10000 (the asset builder may leave weights 0600).
    for directory, _, files in os.walk(store / "repos"):
        Path(directory).chmod(0o755)
        for name in files:
            Path(directory, name).chmod(0o644)
    for operator_dir in ("outputs", "wheels"):
        (store / operator_dir).mkdir(exist_ok=True)
        os.chown(store / operator_dir, JOB_UID, JOB_UID)


@dataclass
class Canary:
    """A TCP server on this machine, on the kind network's host side: every pod could reach it but
    for its NetworkPolicy. Counts the connections it accepted."""

    host: str
    port: int
    accepted: int = 0


# The package the pods tests install: a wheel built here, served by an index on this machine; it
# depends on a second one, and on numpy, which the launcher's image holds.
PROBE_PACKAGE, PROBE_VERSION = "ptprobe", "1.0"


PROBE_DEPENDENCY, PROBE_DEPENDENCY_VERSION = "ptprobedep", "2.0"


def e2e_values(
    image: str,
    emulator_url: str,
    pull_policy: str,
    launcher_image: str | None = None,
    canary: Canary | None = None,
    package_index: str = "",
    environment_images: dict[str, str] | None = None,
) -> dict[str, Any]:
    repository, tag = image.rsplit(":", 1)
    pods: dict[str, Any] = {"enabled": False}
    if launcher_image is not None:
        pods = {
            "enabled": True,
            "image": launcher_image,
            "storeVolume": {"hostPath": {"path": STORE_IN_NODE, "type": "Directory"}},
            "flavors": {**POD_FLAVORS, **FIXED_RUNTIME_FLAVORS},
            "runtimeClasses": [GVISOR_CLASS, ABSENT_CLASS],
            "egressCheck": {
                "probes": [{"name": "canary", "host": canary.host, "port": canary.port}] if canary else []
            },
            "packageIndex": package_index,
            # The node image installs it (devstack/kind/seccomp.py): agent jobs get loopback.
            "loopbackSeccompProfile": seccomp.PROFILE_NAME,
        }
    return {
        "image": {"repository": repository, "tag": tag, "pullPolicy": pull_policy},
        "operator": {"pollIntervalSeconds": 2},
        "hfJobs": {
            "enabled": True,
            "tokenSecret": {"name": "hf-token", "key": "token"},
            "namespace": HF_NAMESPACE,
            "endpoint": emulator_url,
            "bucket": BUCKET,
            # The emulator runs every job with its own launcher, whatever image a job names.
            "image": launcher_image or "localhost/posttrain-launcher:0.1.0",
        },
        "gateway": {"orchestratorTokenSecret": {"name": "orchestrator", "key": "token"}},
        "pods": pods,
        "environments": environment_images or {},
        "logging": {"format": "json"},
        "tasks": {"settings": GSM8K_STANDIN},  # gsm8k runs on its stand-in here
    }


def install_chart(cluster: Cluster, values: dict[str, Any]) -> float:
    """`helm upgrade --install --wait` with these values; returns the seconds it took."""
    with tempfile.TemporaryDirectory(prefix="e2e-values-") as tmp:
        path = Path(tmp) / "values.yaml"
        path.write_text(yaml.safe_dump(values))
        started = time.monotonic()
        proc = cluster.helm(
            "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path),
            "--wait", "--timeout", "8m",
        )  # fmt: skip
    if proc.returncode != 0:
        pods = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide", check=False)
        events = cluster.kubectl("-n", NAMESPACE, "get", "events", "--sort-by=.lastTimestamp", check=False)
        pytest.fail(f"helm install failed: {proc.stderr}\n{pods}\n{events[-4000:]}")
    return time.monotonic() - started


def use_job_runtime(release: Release, runtime: str) -> None:
    """Every pods flavor on `runtime` ("runc": the node's default; "gvisor": the chart's RuntimeClass),
    by a chart upgrade, as a platform team would switch them (a kept release may be on either)."""
    flavors = {
        name: {**flavor, "runtimeClassName": GVISOR_CLASS["name"]} if runtime == "gvisor" else flavor
        for name, flavor in POD_FLAVORS.items()
    }
    values = {
        **release.values,
        "pods": {**release.values["pods"], "flavors": {**flavors, **FIXED_RUNTIME_FLAVORS}},
    }
    install_chart(release.cluster, values)
    release.values, release.job_runtime = values, runtime


@contextlib.contextmanager
def port_forward(release: Release, target: str, port: int) -> Iterator[str]:
    """`kubectl port-forward` to `target` (e.g. `svc/NAME`); yields http://127.0.0.1:<local port>."""
    proc = subprocess.Popen(
        [str(release.cluster.bin_dir / "kubectl"), f"--kubeconfig={release.cluster.kubeconfig}",
         "-n", release.namespace, "port-forward", target, f":{port}"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        if not match:
            raise AssertionError(
                f"port-forward {target} failed: {line}{proc.stderr.read() if proc.stderr else ''}"
            )
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def run_probe_pod(release: Release, script: str, labels: dict[str, str] | None = None) -> tuple[str, str]:
    """Run `python -c script` in a one-off pod of the operator image; returns (phase, logs)."""
    name = f"probe-{uuid.uuid4().hex[:8]}"
    security = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 10000,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app.kubernetes.io/name": "e2e-probe"}},
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "probe",
                    "image": release.operator_image,
                    "imagePullPolicy": "Never" if release.cluster.is_kind else "IfNotPresent",
                    "command": ["python", "-c", script],
                    "securityContext": security,
                }
            ],
        },
    }
    release.kubectl("apply", "-f", "-", input=json.dumps(pod))
    try:
        done: str = wait_for(
            lambda: release.json("get", "pod", name)["status"].get("phase") in ("Succeeded", "Failed")
            and release.json("get", "pod", name)["status"]["phase"],
            timeout=180,
            interval=1,
            what=f"probe pod {name} to finish",
        )
        return done, release.kubectl("logs", name, check=False)
    finally:
        release.kubectl("delete", "pod", name, "--wait=false", check=False)


Waiter = Callable[..., Any]
