"""The chart's `helm test` probe (the script its hook pod runs, taken from the rendered chart) against
a real gateway and operator: it passes while both serve, and fails, naming the step, once the
gateway is gone (as with the Deployment scaled to zero) or the orchestrator token is wrong. The
devstack has no kubelet, so the pod itself runs only on kind (`make e2e` runs `helm test`)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from devstack.controlplane import cluster as devcluster
from tests.integration.gateway.support import gateway_beside
from tests.integration.support import OperatorProcess
from tests.unit.helm.chart import FULL, HF_VALUES, one, render


@pytest.fixture(scope="module")
def probe_script(tmp_path_factory: pytest.TempPathFactory) -> Path:
    config = one(render(HF_VALUES), "ConfigMap", f"{FULL}-test-probe")
    path = tmp_path_factory.mktemp("probe") / "probe.py"
    path.write_text(config["data"]["probe.py"])
    return path


def _probe(script: Path, gateway_url: str, operator_url: str, token: str) -> subprocess.CompletedProcess[str]:
    env = {
        "GATEWAY_URL": gateway_url,
        "OPERATOR_URL": operator_url,
        "ORCHESTRATOR_TOKEN": token,
        "PROBE_CONNECT_SECONDS": "4",
    }  # a refused connection is tried again for 4 s, not 60
    return subprocess.run([sys.executable, "-I", str(script)], env=env, capture_output=True, text=True,
                          timeout=120)  # fmt: skip


def test_the_probe_passes_while_both_serve_and_fails_once_the_gateway_is_gone(
    cluster: devcluster.ClusterState,
    namespace: str,
    operator: OperatorProcess,
    gateway_sa_token: Path,
    probe_script: Path,
) -> None:
    operator.wait_ready(timeout=300)
    serving = gateway_beside(operator, cluster, namespace, gateway_sa_token)
    gateway = next(serving)
    try:
        passed = _probe(probe_script, gateway.url, operator.broker_url, gateway.orchestrator_token)
        assert passed.returncode == 0, passed.stdout + passed.stderr
        assert "ok gateway /health" in passed.stdout and "ok operator /healthz" in passed.stdout
        assert "ok gateway tools/list:" in passed.stdout and "submit" in passed.stdout

        wrong = _probe(probe_script, gateway.url, operator.broker_url, "not-the-token")
        assert wrong.returncode == 1 and "FAIL session" in wrong.stderr and "401" in wrong.stderr
    finally:
        serving.close()  # the gateway stops listening, as with no endpoints behind its Service
    gone = _probe(probe_script, gateway.url, operator.broker_url, gateway.orchestrator_token)
    assert gone.returncode == 1 and "FAIL gateway health" in gone.stderr, gone.stderr


def test_the_probe_fails_when_the_operator_does_not_answer(
    cluster: devcluster.ClusterState,
    namespace: str,
    operator: OperatorProcess,
    gateway_sa_token: Path,
    probe_script: Path,
) -> None:
    operator.wait_ready(timeout=300)
    for gateway in gateway_beside(operator, cluster, namespace, gateway_sa_token):
        operator.stop()
        down = _probe(probe_script, gateway.url, operator.broker_url, gateway.orchestrator_token)
        assert down.returncode == 1 and "FAIL operator readiness" in down.stderr, down.stderr
