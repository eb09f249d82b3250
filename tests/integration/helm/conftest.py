"""The chart installed into the devstack cluster, and the operator and the gateway run as local
processes with the chart's own ServiceAccount credentials and the chart's own command and settings.

The devstack has no node, so the chart's pods never run; everything else the chart creates (RBAC,
ServiceAccounts, the admission policy) is real, and the two processes run as those pods would."""

from __future__ import annotations

import base64
import json
import secrets
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from env_gateway.config import GatewaySettings
from tests.conftest import Kubectl, make_kubectl
from tests.helpers import kubectl_json, wait_for
from tests.integration.conftest import BUCKET, HF_NAMESPACE, HF_TOKEN, REPO, OperatorProcess, episode_manifest
from tests.integration.gateway.conftest import GatewayServer, serve

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


def _secret(kubectl: Kubectl, namespace: str, name: str, value: str) -> None:
    kubectl("-n", namespace, "create", "secret", "generic", name, f"--from-literal=token={value}")


@pytest.fixture
def release(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    crds: None,
    namespace: str,
    executing_emulator: HfEmulator,
    tmp_path: Path,
) -> Iterator[Release]:
    """`helm install` of the chart: one release per test namespace, watching only that namespace
    and binding its admission policy to it, so concurrent tests on a shared cluster never meet."""
    name = f"pt-{namespace}"
    audit_offset = Path(cluster.audit_log).stat().st_size
    orchestrator_token = secrets.token_urlsafe(24)
    _secret(kubectl, namespace, "hf-token", HF_TOKEN)
    _secret(kubectl, namespace, "orchestrator-token", orchestrator_token)
    values: dict[str, Any] = {
        "image": {"repository": "localhost/posttrain-operator", "tag": "0.1.0", "pullPolicy": "Never"},
        "operator": {"watchNamespaces": [namespace], "pollIntervalSeconds": 0.5},
        "gateway": {"orchestratorTokenSecret": {"name": "orchestrator-token", "key": "token"}},
        "hfJobs": {
            "enabled": True,
            "tokenSecret": {"name": "hf-token", "key": "token"},
            "namespace": HF_NAMESPACE,
            "endpoint": executing_emulator.url,
            "bucket": BUCKET,
            "image": "localhost/posttrain-launcher:0.1.0",  # the emulator runs its own launcher
        },
        "admissionPolicy": {
            "enabled": True,
            "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}},
        },
    }
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    helm(cluster, "install", name, str(CHART), "--namespace", namespace, "--values", str(values_file))
    fullname = f"{name}-posttrain-operator"
    try:
        out = tmp_path / "identities"
        out.mkdir()
        op_kc = devcluster.mint_service_account_kubeconfig(
            cluster, namespace, f"{fullname}-operator", out / "operator.kubeconfig"
        )
        gw_kc = devcluster.mint_service_account_kubeconfig(
            cluster, namespace, f"{fullname}-gateway", out / "gateway.kubeconfig"
        )
        token_file = out / "gateway.token"
        token_file.write_text(yaml.safe_load(gw_kc.read_text())["users"][0]["user"]["token"])
        yield Release(
            name=name,
            namespace=namespace,
            fullname=fullname,
            operator_sa=f"{fullname}-operator",
            gateway_sa=f"{fullname}-gateway",
            operator_kubeconfig=op_kc,
            gateway_kubeconfig=gw_kc,
            gateway_token_file=token_file,
            orchestrator_token=orchestrator_token,
            audit_offset=audit_offset,
        )
    finally:
        # No hooks: the pre-delete safeguard's Job needs a node, which the devstack has not (its
        # command is run as a process by test_uninstall).
        helm(cluster, "uninstall", name, "--namespace", namespace, "--wait=false", "--no-hooks")


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
        self.health_port = devcluster.free_port()
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


@pytest.fixture
def chart_operator(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    release: Release,
    executing_emulator: HfEmulator,
    tmp_path: Path,
) -> Iterator[ChartOperator]:
    container = deployment_container(kubectl, release, "operator")
    env = resolve_env(kubectl, release.namespace, container)
    op = ChartOperator(
        cluster, executing_emulator, tmp_path, release, container, env, release.operator_kubeconfig
    ).start()
    try:
        op.wait_ready()
        # The operator wrote its registered tasks before it reported ready; the task policy reads them
        # through the API server's informer, a moment later.
        episode = json.dumps(episode_manifest("policy-probe"))
        wait_for(
            lambda: kubectl("-n", release.namespace, "create", "--dry-run=server", "-f", "-",
                            check=False, input=episode).returncode == 0,
            timeout=30, what="the task policy to admit a registered task",
        )  # fmt: skip
        yield op
    finally:
        op.stop()
        sys.stderr.write(op.logs()[-8000:])


@pytest.fixture
def chart_gateway(
    kubectl: Kubectl, release: Release, chart_operator: ChartOperator
) -> Iterator[GatewayServer]:
    """The gateway with the chart's settings (GATEWAY_* of its Deployment, Secrets resolved), its
    ServiceAccount's credentials, and the broker of the local operator."""
    container = deployment_container(kubectl, release, "gateway")
    env = resolve_env(kubectl, release.namespace, container)
    fields: dict[str, Any] = {}
    for key, value in env.items():
        if key.startswith("GATEWAY_"):
            field = key.removeprefix("GATEWAY_").lower()
            fields[field] = json.loads(value) if value.startswith("[") else value
    assert fields["namespace"] == release.namespace
    assert fields["broker_url"] == f"http://{release.fullname}-broker.{release.namespace}.svc:8081"
    fields.update(
        broker_url=chart_operator.broker_url,
        broker_token_file=str(release.gateway_token_file),
        kubeconfig=str(release.gateway_kubeconfig),
    )
    settings = GatewaySettings(**fields)  # extra="forbid": every variable the chart sets is a real setting
    for url in serve(settings):
        yield GatewayServer(url, release.orchestrator_token, release.namespace)


@pytest.fixture
def as_operator(cluster: devcluster.ClusterState, release: Release) -> Kubectl:
    return make_kubectl(cluster, release.operator_kubeconfig)


@pytest.fixture
def as_gateway(cluster: devcluster.ClusterState, release: Release) -> Kubectl:
    return make_kubectl(cluster, release.gateway_kubeconfig)
