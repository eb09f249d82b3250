"""Helm test helpers: a release of the chart, helm itself, and the operator run with the chart's
credentials, command and settings, as its pod would run it."""

from __future__ import annotations

import base64
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl, kubectl_json
from tests.integration.support import REPO, OperatorProcess

CHART = REPO / "helm" / "posttrain-operator"


@dataclass
class Release:
    name: str
    namespace: str
    fullname: str
    operator_sa: str
    gateway_sa: str
    operator_kubeconfig: Path
    gateway_kubeconfig: Path
    gateway_token_file: Path
    orchestrator_token: str
    # Where the audit log stood before the install: everything the release's identities did is after.
    audit_offset: int

    @property
    def operator_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.operator_sa}"

    @property
    def gateway_user(self) -> str:
        return f"system:serviceaccount:{self.namespace}:{self.gateway_sa}"


def helm(cluster: devcluster.ClusterState, *args: str) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(
        [str(Path(cluster.kubectl()).parent / "helm"), f"--kubeconfig={cluster.kubeconfig}", *args],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, f"helm {' '.join(args)}: {proc.stdout}\n{proc.stderr}"
    return proc


def create_secret(kubectl: Kubectl, namespace: str, name: str, value: str) -> None:
    kubectl("-n", namespace, "create", "secret", "generic", name, f"--from-literal=token={value}")


def deployment_container(kubectl: Kubectl, release: Release, component: str) -> dict[str, Any]:
    """The container the chart would run, as installed in the cluster."""
    name = f"{release.fullname}-{component}"
    deployment = kubectl_json(kubectl, "-n", release.namespace, "get", "deployment", name)
    container: dict[str, Any] = deployment["spec"]["template"]["spec"]["containers"][0]
    return container


def resolve_env(kubectl: Kubectl, namespace: str, container: dict[str, Any]) -> dict[str, str]:
    """The container's environment as the kubelet would give it: Secret references resolved."""
    env: dict[str, str] = {}
    for entry in container.get("env", []):
        if "value" in entry:
            env[entry["name"]] = entry["value"]
            continue
        if "fieldRef" in entry["valueFrom"]:  # the downward API: only the pod's name is used
            assert entry["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name", entry
            env[entry["name"]] = "chart-operator-0"
            continue
        ref = entry["valueFrom"]["secretKeyRef"]
        secret = kubectl_json(kubectl, "-n", namespace, "get", "secret", ref["name"])
        env[entry["name"]] = base64.b64decode(secret["data"][ref["key"]]).decode()
    return env


class ChartOperator(OperatorProcess):
    """The operator as the chart's Deployment runs it (its args and env), with the chart's
    ServiceAccount token instead of the in-cluster one, and loopback ports instead of the pod's."""

    def __init__(
        self,
        cluster: devcluster.ClusterState,
        emulator: HfEmulator,
        log_dir: Path,
        release: Release,
        container: dict[str, Any],
        env: dict[str, str],
        kubeconfig: Path,
    ) -> None:
        super().__init__(cluster, emulator, log_dir, release.namespace)
        self.kubeconfig = kubeconfig
        self.health_port = devcluster.free_port(avoid={self.broker_port, self.metrics_port})
        self.chart_env = env
        assert container["command"] == ["python", "-m", "kopf"], container["command"]
        self.chart_args = [
            f"--liveness=http://127.0.0.1:{self.health_port}/healthz" if a.startswith("--liveness=") else a
            for a in container["args"]
        ]

    def env(self) -> dict[str, str]:
        base = {k: v for k, v in super().env().items() if not k.startswith("POSTTRAIN_")}
        base.update(self.chart_env)
        base.update(
            KUBECONFIG=str(self.kubeconfig),
            HOME=str(self.log_dir),
            HF_HOME=str(self.log_dir / "hf-home"),
            POSTTRAIN_BROKER_HOST="127.0.0.1",
            POSTTRAIN_BROKER_PORT=str(self.broker_port),
            # The chart's fixed metrics port would collide with another test's operator on this host.
            POSTTRAIN_METRICS_HOST="127.0.0.1",
            POSTTRAIN_METRICS_PORT=str(self.metrics_port),
            # Test pace only: the chart leaves these at their defaults.
            POSTTRAIN_EPISODE_TICK_SECONDS="0.5",
            POSTTRAIN_HF_HTTP_TIMEOUT_SECONDS="3",
        )
        return base

    def start(self) -> ChartOperator:
        self.starts += 1
        log = open(self.log_dir / f"operator-{self.starts}.log", "wb")  # noqa: SIM115 - owned by the process
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "kopf", *self.chart_args], env=self.env(), stdout=log,
            stderr=subprocess.STDOUT, cwd=REPO,
        )  # fmt: skip
        return self
