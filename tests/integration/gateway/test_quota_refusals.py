"""An agent whose namespace's BudgetQuota is nearly spent, through the real gateway and operator: a job
its Episode could pay for is refused `quota_exceeded`, told what is left of the quota and what the job
needs; a flavor outside the quota is refused `not_in_quota`; neither is billed nor reserved."""

from __future__ import annotations

import json

from tests.helpers import Kubectl, kubectl_json
from tests.integration.gateway.support import GatewayServer, orchestrator
from tests.integration.gateway.test_gateway_metrics import error_code


async def test_the_agent_is_told_the_quota_refused_its_job(kubectl: Kubectl, gateway: GatewayServer) -> None:
    quota = {"apiVersion": "posttrain.dev/v1alpha1", "kind": "BudgetQuota", "metadata": {"name": "default"},
             "spec": {"limitUSD": "0.001", "flavors": ["cpu-basic"]}}  # fmt: skip
    kubectl("-n", gateway.namespace, "create", "-f", "-", input=json.dumps(quota))
    async with orchestrator(gateway) as orch:
        # No flavors of its own: the task's (cpu-basic, cpu-upgrade) narrowed to the quota's.
        reset = await orch.reset(task="t0_artifact", budget_usd="1.00")
        info = await orch.call("task_info")
        assert '"flavors": ["cpu-basic"]' in json.dumps(info["observation"]), info
        # 600 s on cpu-basic needs $0.00167: the Episode's $1 would pay, the quota's $0.001 does not.
        reply = await orch.call("jobs_submit", script="print(1)", timeout_seconds=600)
        assert error_code(reply) == "quota_exceeded", reply
        message = json.dumps(reply["observation"])
        assert "the namespace's BudgetQuota has $0.001 left of its $0.001" in message, message
        assert "this job needs $0.00167" in message, message
        upgrade = await orch.call("jobs_submit", script="print(1)", timeout_seconds=60, flavor="cpu-upgrade")
        assert error_code(upgrade) == "not_in_quota", upgrade
        assert "allows this episode: cpu-basic" in json.dumps(upgrade["observation"]), upgrade
        episode = reset["observation"]["episode"]
    quota_now = kubectl_json(kubectl, "-n", gateway.namespace, "get", "budgetquota", "default")
    assert not quota_now["status"].get("reservations")
    assert quota_now["status"]["reservedMicroUSD"] == 0 and quota_now["status"]["settledMicroUSD"] == 0
    ledger = kubectl_json(kubectl, "-n", gateway.namespace, "get", "episode", episode)["status"]["ledger"]
    assert ledger.get("entries", {}) == {} and ledger["reservedMicroUSD"] == 0
