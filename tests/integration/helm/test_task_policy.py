"""Tasks are plugins, and the API server knows which are registered: the chart's admission policy
refuses an Episode naming any task the operator has not registered, with the registered ones in the
message; `t1_linear_map`, a task added only through an entry point of its own package
(examples/linear-map-task), is accepted, shown by `task_info` and played to its reward."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from graders.tasks import task_names
from tests.helpers import Kubectl, kubectl_json, wait_for
from tests.integration.gateway.support import GatewayServer, orchestrator
from tests.integration.helm.support import ChartOperator, Release
from tests.integration.helm.test_chart_rbac import tool, wait_job
from tests.integration.support import episode_manifest

PLUGIN_TASK = "t1_linear_map"
SOLUTION = (Path(__file__).resolve().parents[3] / "examples" / "linear-map-task" / "solution.py").read_text()


def _create(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> Any:
    return kubectl(
        "-n", namespace, "create", "--dry-run=server", "-o", "name", "-f", "-",
        check=False, input=json.dumps(manifest),
    )  # fmt: skip


def test_episodes_are_refused_until_the_operator_has_registered_its_tasks(
    kubectl: Kubectl, release: Release
) -> None:
    # No operator has run: there is no list to check against, so nothing gets through unchecked.
    refused = wait_for(
        lambda: (r := _create(kubectl, release.namespace, episode_manifest("early"))).returncode != 0 and r,
        timeout=30, what="the task policy to refuse Episodes before the operator has written its list",
    )  # fmt: skip
    assert "no task is registered yet: the posttrain operator lists its tasks here" in refused.stderr
    assert kubectl_json(kubectl, "-n", release.namespace, "get", "episodes")["items"] == []


async def test_unknown_tasks_are_refused_and_a_plugin_task_is_played_to_its_reward(
    kubectl: Kubectl, release: Release, chart_operator: ChartOperator, chart_gateway: GatewayServer
) -> None:
    ns = release.namespace
    assert PLUGIN_TASK in task_names()
    policy = kubectl_json(kubectl, "get", "validatingadmissionpolicy", f"{release.fullname}-tasks")
    listed = ", ".join(f"'{name}'" for name in task_names())
    assert policy["spec"]["variables"] == [{"name": "registered", "expression": f"[{listed}]"}]

    unknown = episode_manifest("unknown", task="t9_no_such_task")
    # A policy change takes effect a moment later (the API server's informer).
    refused = wait_for(
        lambda: (r := _create(kubectl, ns, unknown)).returncode != 0 and "not registered" in r.stderr and r,
        timeout=30, what="the task policy to refuse an unknown task",
    )  # fmt: skip
    assert f"task t9_no_such_task is not registered; registered tasks: {', '.join(task_names())}" in (
        refused.stderr
    ), refused.stderr
    assert _create(kubectl, ns, episode_manifest("plugin", task=PLUGIN_TASK)).returncode == 0
    assert kubectl_json(kubectl, "-n", ns, "get", "episodes")["items"] == []

    # The plugin task through the chart's gateway: created by the gateway, shown, trained, graded.
    async with orchestrator(chart_gateway) as orch:
        await orch.reset(task=PLUGIN_TASK)
        info = await tool(orch, "task_info")
        assert info["name"] == PLUGIN_TASK
        assert set(info["agent_datasets"]) == {"train", "dev"}
        assert "hidden" not in json.dumps(info["agent_datasets"])
        job = (await tool(orch, "jobs_submit", script=SOLUTION, timeout_seconds=300))["job"]["name"]
        assert (await wait_job(orch, job))["job"]["phase"] == "Succeeded"
        dev = await tool(orch, "dev_evaluate", job=job)
        assert (await wait_job(orch, dev["job"]["name"]))["job"]["result"]["score"] == "1"
        await tool(orch, "submit", job=job)
        final: dict[str, Any] = {"finished": False}
        while not final["finished"]:
            final = await tool(orch, "jobs_wait", timeout_seconds=20)
        assert final["outcome"] == "Scored" and final["reward"] == "1", final
