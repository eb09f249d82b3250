"""What an agent sees of its jobs is what the backend reported: a script that exits 3 is a Failed job
with exit code 3, in the AgentJob's status and in the tool results (jobs_wait, jobs_status)."""

from __future__ import annotations

from typing import Any

from tests.conftest import Kubectl
from tests.integration.conftest import get
from tests.integration.gateway.conftest import GatewayServer, orchestrator


def result(step: dict[str, Any]) -> dict[str, Any]:
    assert step["observation"]["error"] is None, step["observation"]
    data: dict[str, Any] = step["observation"]["result"]["data"]
    return data


async def test_the_exit_code_of_a_failed_script_reaches_the_agent(
    executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    async with orchestrator(executing_gateway) as orch:
        await orch.reset(task="t0_artifact", budget_usd="0.05")
        submitted = result(await orch.call("jobs_submit", script="raise SystemExit(3)", timeout_seconds=120))
        name = submitted["job"]["name"]
        waited: dict[str, Any] = {"finished": False}
        while not waited["finished"]:
            waited = result(await orch.call("jobs_wait", job=name, timeout_seconds=20))
        assert (waited["job"]["phase"], waited["job"]["exit_code"]) == ("Failed", 3), waited["job"]
        (listed,) = result(await orch.call("jobs_status"))["jobs"]
        assert (listed["name"], listed["exit_code"]) == (name, 3)
    assert get(kubectl, executing_gateway.namespace, "agentjob", name)["status"]["exitCode"] == 3
