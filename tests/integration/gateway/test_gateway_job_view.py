"""The AgentJobs the gateway makes, and what an agent sees of them: a job is created owned by its
Episode and holding the operator's finalizer; what the agent sees is what the backend reported (a
script that exits 3 is a Failed job with exit code 3, in the AgentJob's status and in the tool results,
jobs_wait and jobs_status)."""

from __future__ import annotations

from typing import Any

from posttrain_operator.api.rules import EPISODE_LABEL, FINALIZER

from tests.helpers import Kubectl
from tests.integration.gateway.support import GatewayServer, orchestrator
from tests.integration.support import get


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


async def test_a_job_is_born_owned_by_its_episode_and_holding_the_operators_finalizer(
    gateway: GatewayServer, kubectl: Kubectl
) -> None:
    """So the operator admits it in its first pass: it neither waits for kopf to add the finalizer nor
    patches the job to adopt it (the unit tier counts those calls). The owner reference does not set
    blockOwnerDeletion: a cluster enforcing owner-reference permissions allows that only to who may
    update the Episode's finalizers, which the gateway's Role does not grant (tests/unit/helm)."""
    async with orchestrator(gateway) as orch:
        episode = (await orch.reset(task="t0_artifact"))["observation"]["episode"]
        name = result(await orch.call("jobs_submit", script="print(1)", timeout_seconds=120))["job"]["name"]
    meta = get(kubectl, gateway.namespace, "agentjob", name)["metadata"]
    episode_uid = get(kubectl, gateway.namespace, "episode", episode)["metadata"]["uid"]
    assert meta["finalizers"] == [FINALIZER]
    assert [(o["kind"], o["name"], o["uid"]) for o in meta["ownerReferences"]] == [
        ("Episode", episode, episode_uid)
    ]
    assert not meta["ownerReferences"][0].get("blockOwnerDeletion")
    assert meta["labels"][EPISODE_LABEL] == episode
