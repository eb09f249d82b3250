"""The chart as users install it: Deployments Ready with their probes, `helm test`, the gateway
through its Service, the NetworkPolicies enforced by the cluster, and whole episodes played by the
scripted MCP agent against the in-cluster gateway, the operator pod submitting to the HF Jobs
emulator on the host, including one in which the operator pod is killed mid-episode."""

from __future__ import annotations

import asyncio
import json
import sys
from typing import Any

import httpx
import pytest
from mcp import Client
from posttrain_operator.backends.hf_client import KEY_LABEL
from posttrain_operator.backends.hf_replies import label_value

from devstack.hf_emulator import HfEmulator
from tests.e2e.support import (
    GATEWAY_DEPLOYMENT,
    GATEWAY_SERVICE,
    NAMESPACE,
    OPERATOR_DEPLOYMENT,
    REPO,
    Release,
    port_forward,
    run_probe_pod,
    say,
)
from tests.helpers import wait_for

sys.path.insert(0, str(REPO / "examples"))
import scripted_sft_agent

# The first test also sets up the session: a kind cluster, the images loaded, `helm install --wait`.
pytestmark = pytest.mark.timeout(1800)


def test_deployments_ready_with_probes(release: Release) -> None:
    for name, component in ((OPERATOR_DEPLOYMENT, "operator"), (GATEWAY_DEPLOYMENT, "gateway")):
        deployment = release.json("get", "deployment", name)
        assert deployment["status"].get("readyReplicas") == 1, deployment["status"]
        container = deployment["spec"]["template"]["spec"]["containers"][0]
        assert container["livenessProbe"]["httpGet"] and container["readinessProbe"]["httpGet"]
        pod = release.ready_pod(component)
        statuses = pod["status"]["containerStatuses"]
        # Ready means the kubelet's readiness probe passes against the running process.
        assert [s["ready"] for s in statuses] == [True], statuses
        assert statuses[0]["image"].endswith(release.operator_image.rsplit("/", 1)[1])


def test_both_components_log_one_json_object_per_line(release: Release) -> None:
    """`logging.format: json` (the e2e values): kopf's JSON lines and the gateway's (logs.py)."""
    for name in (OPERATOR_DEPLOYMENT, GATEWAY_DEPLOYMENT):
        lines = [line for line in release.kubectl("logs", f"deployment/{name}").splitlines() if line.strip()]
        assert lines, f"{name} logged nothing"
        parsed = [json.loads(line) for line in lines]  # any text line fails here
        assert all(isinstance(entry, dict) and entry.get("message") for entry in parsed), lines[:5]


def test_operator_image_has_no_torch(release: Release) -> None:
    phase, logs = run_probe_pod(
        release, "import importlib.util as u; print('torch' if u.find_spec('torch') else 'no-torch')"
    )
    assert (phase, logs.strip()) == ("Succeeded", "no-torch")


def test_helm_test_passes(request: pytest.FixtureRequest, release: Release) -> None:
    proc = release.cluster.helm("test", "pt", "--namespace", NAMESPACE, "--timeout", "5m")
    say(request.config, f"\nhelm test:\n{proc.stdout.strip()}")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Phase:          Succeeded" in proc.stdout


def _served_endpoints(release: Release, service: str) -> list[str]:
    """The ready addresses the Service's EndpointSlices list (what kube-proxy routes to)."""
    slices = release.json("get", "endpointslices", "-l", f"kubernetes.io/service-name={service}")["items"]
    return [
        address
        for endpoint_slice in slices
        for endpoint in endpoint_slice.get("endpoints") or []
        if endpoint.get("conditions", {}).get("ready")
        for address in endpoint["addresses"]
    ]


# kube-proxy (a Service's endpoints) and kube-router (the policies' view of a new pod) write their rules
# moments after the API server lists what they follow, and a connection is refused until then: the
# gateway may have just been recreated, the probe pod always has. A refusal is retried for two minutes.
FETCH_THROUGH_SERVICE = """
import time, urllib.error, urllib.request
for attempt in range(60):
    try:
        print(urllib.request.urlopen({url!r}, timeout=20).read().decode())
        break
    except urllib.error.URLError as exc:
        if not isinstance(exc.reason, ConnectionRefusedError) or attempt == 59:
            raise
        time.sleep(2)
"""


def test_gateway_reached_through_its_service(release: Release) -> None:
    # From a pod: cluster DNS, the Service's ClusterIP (kube-proxy), the gateway's NetworkPolicy.
    url = f"http://{GATEWAY_SERVICE}.{NAMESPACE}.svc/health"
    wait_for(lambda: _served_endpoints(release, GATEWAY_SERVICE), timeout=300, what="a gateway endpoint")
    phase, logs = run_probe_pod(release, FETCH_THROUGH_SERVICE.format(url=url))
    assert phase == "Succeeded", logs
    assert json.loads(logs.strip().splitlines()[-1])["status"] == "healthy"
    # From this machine, through the Service's port.
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as base:
        health = httpx.get(f"{base}/health", timeout=30)
    assert health.status_code == 200 and health.json()["status"] == "healthy"


CONNECT = """
import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10).close()
    print("connected")
except OSError as exc:
    print(f"refused: {exc}")
"""


def _connect_script(host: str, port: int) -> str:
    return f"import sys; sys.argv = ['x', {host!r}, '{port}']\n" + CONNECT


def test_network_policy_only_the_gateway_reaches_the_broker(release: Release) -> None:
    operator = release.ready_pod("operator")
    broker = (operator["status"]["podIP"], 8081)
    # A pod that is not the gateway: its connection is dropped by the operator's NetworkPolicy.
    phase, logs = run_probe_pod(release, _connect_script(*broker))
    assert phase == "Succeeded" and logs.strip().startswith("refused"), logs
    # The gateway's pod reaches the same address and port: the policy, not the network, said no.
    gateway = release.ready_pod("gateway")["metadata"]["name"]
    reply = release.kubectl("exec", gateway, "--", "python", "-c", _connect_script(*broker))
    assert reply.strip() == "connected", reply


def _assert_consistent_ledger(release: Release, emulator: HfEmulator, episode_name: str) -> dict[str, Any]:
    status: dict[str, Any] = release.json("get", "episode", episode_name)["status"]
    ledger = status["ledger"]
    assert ledger["reservedMicroUSD"] == 0, ledger
    assert ledger["settledMicroUSD"] <= ledger["budgetMicroUSD"], ledger
    jobs = [j for j in release.json("get", "agentjobs")["items"] if j["spec"]["episode"] == episode_name]
    billed = {r.job_id: r.cost_micro_usd for r in emulator.billing()}
    agent_jobs = [j for j in jobs if j["spec"]["purpose"] != "score"]
    assert ledger["settledMicroUSD"] == sum(billed[j["status"]["backendJobId"]] for j in agent_jobs)
    for job in jobs:
        assert job["status"]["phase"] == "Succeeded", job["status"]
        # Every backend job was created exactly once, whatever happened to the operator.
        key = label_value(job["status"]["idempotencyKey"])
        assert emulator.creations_by_label(KEY_LABEL).get(key) == 1, (key, emulator.all_creations())
    return status


def test_full_t0_artifact_episode_in_cluster(
    request: pytest.FixtureRequest, release: Release, hf_emulator: HfEmulator
) -> None:
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        result = asyncio.run(
            scripted_sft_agent.run_episode(
                gateway, release.orchestrator_token, "t0_artifact", say=lambda _: None
            )
        )
    say(
        request.config,
        f"\n{'task':14} {'episode':28} {'outcome':8} {'reward':>6} {'dev':>4} {'spend $':>9} {'wall s':>7}\n"
        f"{result.task:14} {result.episode:28} {result.outcome:8} {result.reward or 'null':>6} "
        f"{result.dev_score or '-':>4} {result.spend_usd:>9} {result.wall_seconds:>7}",
    )
    assert (result.outcome, result.reward) == ("Scored", "1"), result
    status = _assert_consistent_ledger(release, hf_emulator, result.episode)
    assert status["phase"] == "Completed" and status["reward"] == "1"


async def _call(session: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    result = await session.call_tool(tool, arguments)
    assert not result.is_error and isinstance(result.structured_content, dict), (tool, result.content)
    return result.structured_content


async def _wait_finished(session: Client, job: str | None = None) -> dict[str, Any]:
    while True:
        waited = await _call(session, "jobs_wait", **({"job": job} if job else {}), timeout_seconds=20)
        if waited["finished"]:
            return waited


def test_operator_pod_killed_mid_episode(release: Release, hf_emulator: HfEmulator) -> None:
    """The operator pod dies while the training job runs; its replacement finishes the episode
    without a second submission, and the ledger adds up."""
    script, timeout = scripted_sft_agent.SOLUTIONS["t0_artifact"]
    old_pod = release.ready_pod("operator")["metadata"]["name"]

    async def play(gateway: str) -> tuple[str, dict[str, Any]]:
        observation = await scripted_sft_agent.reset_episode(
            gateway, release.orchestrator_token, "t0_artifact"
        )
        token, episode = observation["metadata"]["agent_token"], observation["episode"]
        async with scripted_sft_agent.agent_client(gateway, token) as session:
            submitted = await _call(
                session, "jobs_submit", script=script.read_text(), timeout_seconds=timeout
            )
            job = submitted["job"]["name"]
            # The operator has submitted the job to the backend: kill it now.
            await asyncio.to_thread(
                wait_for,
                lambda: release.json("get", "agentjob", job)["status"].get("backendJobId"),
                300,
                1,
                "the training job's backend submission",
            )
            release.kubectl("delete", "pod", old_pod, "--grace-period=1", "--wait=false")
            await asyncio.to_thread(
                wait_for,
                lambda: (p := release.ready_pod("operator")) and p["metadata"]["name"] != old_pod,
                300,
                1,
                "a new operator pod",
            )
            trained = await _wait_finished(session, job)
            assert trained["job"]["phase"] == "Succeeded", trained
            await _call(session, "submit", job=job)
            final = await _wait_finished(session)
        return episode, final

    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        episode, final = asyncio.run(play(gateway))
    assert (final.get("outcome"), final.get("reward")) == ("Scored", "1"), final
    new_pod = release.ready_pod("operator")["metadata"]["name"]
    assert new_pod != old_pod
    status = _assert_consistent_ledger(release, hf_emulator, episode)
    assert status["phase"] == "Completed", status


# Last in the file: run right before the probe through the Service, it left that probe failing twice in
# CI (refused, then a 404, with the new pod Ready and listed as the Service's endpoint; cause not found).
def test_helm_test_fails_with_the_gateway_scaled_to_zero(release: Release) -> None:
    release.kubectl("scale", f"deployment/{GATEWAY_DEPLOYMENT}", "--replicas=0")
    try:
        wait_for(
            lambda: not release.json("get", "deployment", GATEWAY_DEPLOYMENT)["status"].get("replicas"),
            timeout=180, what="the gateway's pods to be gone",
        )  # fmt: skip
        proc = release.cluster.helm("test", "pt", "--namespace", NAMESPACE, "--timeout", "3m")
        assert proc.returncode != 0, proc.stdout
    finally:
        release.kubectl("scale", f"deployment/{GATEWAY_DEPLOYMENT}", "--replicas=1")
        wait_for(
            lambda: release.json("get", "deployment", GATEWAY_DEPLOYMENT)["status"].get("readyReplicas") == 1,
            timeout=300, what="the gateway to be Ready again",
        )  # fmt: skip
        wait_for(lambda: _served_endpoints(release, GATEWAY_SERVICE), timeout=300, what="a gateway endpoint")
