"""A task in an environment image, as an agent and an orchestrator meet it: an operator without the
image refuses its episodes at start with the reason; with it, task_info names the environment and the
packages the task allows, and a package outside them is refused at jobs_submit and at admission,
nothing created for it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl
from tests.integration.gateway.agent_steps import result
from tests.integration.gateway.support import GatewayServer, gateway_beside, orchestrator, snapshot
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    get,
    running_operator,
    wait_phase,
)

TASK = "t0_arithmetic_format_trl"
IMAGE = "registry.example/posttrain-env-trl:test"


@pytest.fixture
def trl_operator(
    cluster: devcluster.ClusterState, crds: None, emulator: HfEmulator, tmp_path: Path, namespace: str
) -> Iterator[OperatorProcess]:
    """An operator whose chart maps the `trl` environment (the emulator runs no job here)."""
    images = json.dumps({"trl": IMAGE})
    with running_operator(cluster, emulator, tmp_path, namespace, POSTTRAIN_ENVIRONMENT_IMAGES=images) as op:
        yield op


@pytest.fixture
def trl_gateway(
    cluster: devcluster.ClusterState, namespace: str, trl_operator: OperatorProcess, gateway_sa_token: Path
) -> Iterator[GatewayServer]:
    yield from gateway_beside(trl_operator, cluster, namespace, gateway_sa_token)


async def test_an_operator_without_the_tasks_image_refuses_its_episode_at_start(
    gateway: GatewayServer, kubectl: Kubectl
) -> None:
    async with orchestrator(gateway) as orch:
        reset = await orch.reset(task=TASK)
    assert reset["done"] is True and reset["metadata"]["phase"] == "Failed", reset["metadata"]
    episode = get(kubectl, gateway.namespace, "episode", reset["observation"]["episode"])
    status = episode["status"]
    assert status["conditions"][-1]["reason"] == "EnvironmentUnavailable"
    assert "environment image(s) trl, which this operator has no image for" in status["message"]


async def test_a_package_outside_the_tasks_allow_list_is_refused_and_nothing_is_made(
    trl_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    namespace = trl_gateway.namespace
    async with orchestrator(trl_gateway) as orch:
        reset = await orch.reset(task=TASK)
        episode = reset["observation"]["episode"]
        info = result(await orch.call("task_info"))
        assert info["agent_environment"] == "trl"
        assert info["allowed_packages"] == ["latex2sympy2-extended", "liger-kernel", "math-verify"]
        before = snapshot(kubectl, namespace)
        refused = await orch.call("jobs_submit", script="print(1)", packages=["math-verify", "Requests>=2"])
    error = refused["observation"]["error"]
    assert error["error_type"] == "invalid_args", error
    assert refused["metadata"]["error_code"] == "package_not_allowed"
    assert "packages ['requests'] are not allowed for task t0_arithmetic_format_trl" in error["message"]
    after = snapshot(kubectl, namespace)
    assert after[1] == before[1]  # no AgentJob

    # Made without the gateway, the operator refuses it at admission with the same reason.
    apply(kubectl, namespace, agentjob_manifest("direct", episode, packages=["requests"]))
    status = wait_phase(kubectl, namespace, "agentjob", "direct", {"Rejected"})["status"]
    assert status["reason"] == "InvalidJob" and "['requests'] are not allowed" in status["message"]
