"""Credentials that expire keep working for the gateway too: it reaches the API server with a
ServiceAccount token from a kubeconfig `tokenFile`; the token is rotated and the old one revoked; the
gateway's writes (a new Episode, step counts, an AgentJob) and reads go on with the new token."""

from __future__ import annotations

import secrets
from pathlib import Path
from typing import Any

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl
from tests.integration.gateway.support import GatewayServer, gateway_settings, orchestrator, serve
from tests.integration.rotating_token import cluster_admin_with_rotating_token
from tests.integration.support import OperatorProcess, get


def result(step: dict[str, Any]) -> dict[str, Any]:
    assert step["observation"]["error"] is None, step["observation"]
    data: dict[str, Any] = step["observation"]["result"]["data"]
    return data


async def test_the_gateway_rereads_a_rotated_token_and_works_after_the_old_one_expires(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    gateway_sa_token: Path,
    tmp_path: Path,
) -> None:
    with cluster_admin_with_rotating_token(cluster, kubectl, namespace, "rotating-gateway", tmp_path) as sa:
        orchestrator_token = secrets.token_urlsafe(24)
        settings = gateway_settings(namespace, operator, gateway_sa_token, cluster, orchestrator_token)
        for url in serve(settings.model_copy(update={"kubeconfig": str(sa.kubeconfig)})):
            gw = GatewayServer(url, orchestrator_token, namespace)
            async with orchestrator(gw) as orch:
                await orch.reset(task="t0_artifact")
                result(await orch.call("jobs_status"))

            sa.rotate()

            async with orchestrator(gw) as orch:
                episode = (await orch.reset(task="t0_artifact"))["observation"]["episode"]
                submitted = result(await orch.call("jobs_submit", script="print(2)", timeout_seconds=120))
                name = submitted["job"]["name"]
                calls, waited = 1, {"finished": False}
                while not waited["finished"]:
                    waited = result(await orch.call("jobs_wait", job=name, timeout_seconds=20))
                    calls += 1
                assert waited["job"]["phase"] == "Succeeded", waited["job"]
    assert get(kubectl, namespace, "agentjob", name)["metadata"]["labels"]["posttrain.dev/episode"] == episode
    assert get(kubectl, namespace, "episode", episode)["status"]["steps"] == calls
