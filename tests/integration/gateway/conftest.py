"""Gateway fixtures: the gateway served by uvicorn on a loopback port (in a thread of the test
process), wired to the devstack cluster and a real operator whose broker trusts the gateway's
ServiceAccount."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from graders.assets import materialize_assets
from tests.gsm8k_standin import SETTINGS, standin_registry
from tests.helpers import Kubectl
from tests.integration.gateway.support import GatewayServer, gateway_beside
from tests.integration.support import BROKER_NAMESPACE, OperatorProcess, running_operator


@pytest.fixture(scope="session")
def gateway_sa_token(
    cluster: devcluster.ClusterState, kubectl: Kubectl, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A TokenRequest token of system:serviceaccount:posttrain-system:gateway, as a projected token file."""
    if kubectl("get", "namespace", BROKER_NAMESPACE, check=False).returncode != 0:
        kubectl("create", "namespace", BROKER_NAMESPACE)
    if kubectl("-n", BROKER_NAMESPACE, "get", "serviceaccount", "gateway", check=False).returncode != 0:
        kubectl("-n", BROKER_NAMESPACE, "create", "serviceaccount", "gateway")
    out = tmp_path_factory.mktemp("gateway-sa")
    kubeconfig = devcluster.mint_service_account_kubeconfig(
        cluster, BROKER_NAMESPACE, "gateway", out / "kubeconfig"
    )
    token = yaml.safe_load(kubeconfig.read_text())["users"][0]["user"]["token"]
    path = out / "token"
    path.write_text(token)
    return path


@pytest.fixture
def gateway(
    cluster: devcluster.ClusterState, namespace: str, operator: OperatorProcess, gateway_sa_token: Path
) -> Iterator[GatewayServer]:
    """The gateway beside an operator whose emulated jobs run no process (2 s each)."""
    yield from gateway_beside(operator, cluster, namespace, gateway_sa_token)


@pytest.fixture
def executing_gateway(
    cluster: devcluster.ClusterState,
    namespace: str,
    executing_operator: OperatorProcess,
    gateway_sa_token: Path,
) -> Iterator[GatewayServer]:
    """The gateway beside an operator whose jobs really run under the launcher (real grading)."""
    yield from gateway_beside(executing_operator, cluster, namespace, gateway_sa_token)


@pytest.fixture
def standin_settings() -> dict[str, str]:
    """Settings a test module adds to the stand-in operator's (by overriding this fixture)."""
    return {}


@pytest.fixture
def standin_operator(
    cluster: devcluster.ClusterState,
    crds: None,
    executing_emulator: HfEmulator,
    tmp_path: Path,
    namespace: str,
    standin_settings: dict[str, str],
) -> Iterator[OperatorProcess]:
    """The operator, the gateway's registry (in this process) and the emulator's Hub, all on the stand-in."""
    with standin_registry():
        for repo in materialize_assets():  # builds the stand-in's repos once (cached by revision)
            executing_emulator.repos.register(repo.ref.kind, repo.ref.repo_id, repo.ref.revision, repo.path)
        images = json.dumps({"trl": "registry.example/posttrain-env-trl:test"})  # the emulator runs any image
        with running_operator(
            cluster, executing_emulator, tmp_path, namespace, POSTTRAIN_ENVIRONMENT_IMAGES=images,
            **SETTINGS, **standin_settings,
        ) as op:  # fmt: skip
            yield op


@pytest.fixture
def standin_gateway(
    cluster: devcluster.ClusterState,
    namespace: str,
    standin_operator: OperatorProcess,
    gateway_sa_token: Path,
) -> Iterator[GatewayServer]:
    yield from gateway_beside(standin_operator, cluster, namespace, gateway_sa_token)
