"""The chart installed into the devstack cluster, and the operator and the gateway run as local
processes with the chart's own ServiceAccount credentials and the chart's own command and settings.

The devstack has no node, so the chart's pods never run; everything else the chart creates (RBAC,
ServiceAccounts, the admission policy) is real, and the two processes run as those pods would."""

from __future__ import annotations

import json
import secrets
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from env_gateway.config import GatewaySettings
from tests.helpers import Kubectl, make_kubectl, wait_for
from tests.integration.gateway.support import GatewayServer, serve
from tests.integration.helm.support import (
    CHART,
    ChartOperator,
    Release,
    create_secret,
    deployment_container,
    helm,
    resolve_env,
)
from tests.integration.support import BUCKET, HF_NAMESPACE, HF_TOKEN, episode_manifest


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
    create_secret(kubectl, namespace, "hf-token", HF_TOKEN)
    create_secret(kubectl, namespace, "orchestrator-token", orchestrator_token)
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
