"""The kube-apiserver restarts while three clients call tools in a loop, each on its own surface: the
MCP SDK's client, a raw JSON-RPC client of `/mcp` and an OpenEnv `/ws` client. The gateway runs as the
chart's ServiceAccount (its Role, rendered from the chart), so a server still loading its RBAC is met
as the gateway meets it in a cluster.

Zero HTTP 500s and no untyped error: every refusal says the platform is unavailable and may be retried
(503 with Retry-After and JSON-RPC code -32050, or a typed `/ws` frame); the Episode's step count
equals the calls that were served; every call made after the restart is served.

The cluster is the test's own (its API server is stopped), not the session's."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import secrets
import subprocess
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import httpx2
import pytest
import websockets
import yaml
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from devstack.controlplane import cluster as devcluster
from env_gateway.config import GatewaySettings
from env_gateway.wire import JSONRPC_UNAVAILABLE, UNAVAILABLE_CODE
from tests.helpers import Kubectl, kubectl_json, make_kubectl
from tests.integration.gateway.support import serve
from tests.integration.support import REPO, apply, episode_manifest, install_crds

EPISODE = "outage"
NAMESPACE = "agents"
RELEASE = "pt"
# How long any awaited state may take on a loaded machine (a state is awaited; this bounds a failure).
STATE_WITHIN_SECONDS = 180
# A client's pause after a refusal (real clients wait out Retry-After; this keeps the loop cheap).
PAUSE_AFTER_REFUSAL_SECONDS = 0.2


@dataclass
class Tally:
    """One client's calls, by the phase of the outage each call started in."""

    served: dict[str, int] = field(default_factory=dict)
    refused: dict[str, int] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)

    def count(self, kind: dict[str, int], phase: str) -> None:
        kind[phase] = kind.get(phase, 0) + 1


class Outage:
    """Where the API server is: `up`, `down` (stopped), `restarting`, `ready` (answering again)."""

    def __init__(self) -> None:
        self.phase = "up"
        self.running = True


Call = Callable[[], Awaitable[str]]  # "served" or "refused"; raises AssertionError on a fault


async def loop(name: str, call: Call, outage: Outage, tally: Tally) -> None:
    while outage.running:
        phase = outage.phase
        try:
            verdict = await call()
        except AssertionError as exc:
            tally.faults.append(f"{name} in {phase}: {exc}")
            await asyncio.sleep(PAUSE_AFTER_REFUSAL_SECONDS)
            continue
        if verdict == "served":
            tally.count(tally.served, phase)
        else:
            tally.count(tally.refused, phase)
            await asyncio.sleep(PAUSE_AFTER_REFUSAL_SECONDS)


def typed_rpc_refusal(error: dict[str, Any]) -> bool:
    data = error.get("data") or {}
    return (
        error.get("code") == JSONRPC_UNAVAILABLE
        and data.get("code") == UNAVAILABLE_CODE
        and data.get("retryable") is True
        and data.get("retry_after_seconds", 0) >= 1
    )


@pytest.fixture
def own_cluster() -> Iterator[devcluster.ClusterState]:
    name = f"outage-{uuid.uuid4().hex[:8]}"
    state = devcluster.up(name)
    try:
        yield state
    finally:
        devcluster.down(name)


def chart_gateway_identity(state: devcluster.ClusterState, kubectl: Kubectl, out: Path) -> Path:
    """The chart's gateway ServiceAccount and Role in NAMESPACE; a kubeconfig with its token."""
    helm = Path(state.kubectl()).parent / "helm"
    rendered = subprocess.run(
        [str(helm), "template", RELEASE, str(REPO / "helm" / "posttrain-operator"), "--namespace", NAMESPACE,
         "--set", "gateway.orchestratorTokenSecret.name=unused",
         "--show-only", "templates/serviceaccounts.yaml", "--show-only", "templates/rbac-gateway.yaml"],
        capture_output=True, text=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    kubectl("-n", NAMESPACE, "apply", "-f", "-", input=rendered)
    account = next(
        d["metadata"]["name"]
        for d in yaml.safe_load_all(rendered)
        if d and d["kind"] == "ServiceAccount" and d["metadata"]["name"].endswith("-gateway")
    )
    return devcluster.mint_service_account_kubeconfig(state, NAMESPACE, account, out / "gateway.kubeconfig")


@pytest.fixture
def outage_gateway(own_cluster: devcluster.ClusterState, tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """(gateway URL, agent token, orchestrator token) with one Running Episode, as the operator
    would have started it (no operator runs: the test plays it)."""
    kubectl = make_kubectl(own_cluster)
    install_crds(kubectl)
    kubectl("create", "namespace", NAMESPACE)
    kubeconfig = chart_gateway_identity(own_cluster, kubectl, tmp_path)
    agent_token, orchestrator_token = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
    digest = hashlib.sha256(agent_token.encode()).hexdigest()
    apply(kubectl, NAMESPACE, episode_manifest(EPISODE, agentTokenHash=digest, limits={"maxSteps": 100_000}))
    status = json.dumps({"status": {"phase": "Running", "steps": 0}})
    kubectl("-n", NAMESPACE, "patch", "episode", EPISODE, "--subresource=status", "--type=merge",
            "-p", status)  # fmt: skip
    (tmp_path / "broker-token").write_text("unused")
    settings = GatewaySettings(
        namespace=NAMESPACE,
        orchestrator_token=orchestrator_token,  # type: ignore[arg-type]
        broker_url="http://127.0.0.1:9",
        broker_token_file=str(tmp_path / "broker-token"),
        kubeconfig=str(kubeconfig),
    )
    for url in serve(settings):
        yield url, agent_token, orchestrator_token


@contextlib.asynccontextmanager
async def sdk_client(url: str, token: str) -> AsyncIterator[Call]:
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(streamable_http_client(f"{url}/mcp", http_client=http), cache=None) as client,
    ):

        async def call() -> str:
            try:
                answer = await client.call_tool("task_info", {})
            except MCPError as exc:
                error = {"code": exc.code, "message": exc.message, "data": exc.data}
                assert typed_rpc_refusal(error), f"untyped MCP error {error}"
                return "refused"
            assert not answer.is_error, answer
            return "served"

        yield call


@contextlib.asynccontextmanager
async def rpc_client(url: str, token: str) -> AsyncIterator[Call]:
    message = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "task_info"}}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as http:

        async def call() -> str:
            response = await http.post("/mcp", json=message)
            if response.status_code == 503:
                error = response.json().get("error") or {}
                assert typed_rpc_refusal(error) and error["data"]["retry_after_seconds"] == int(
                    response.headers["Retry-After"]
                ), f"503 without the typed error: {response.text[:300]}"
                return "refused"
            assert response.status_code == 200, f"HTTP {response.status_code}: {response.text[:300]}"
            result = response.json().get("result") or {}
            assert result.get("isError") is False, f"not served: {response.text[:300]}"
            return "served"

        yield call


@contextlib.asynccontextmanager
async def ws_client(url: str, orchestrator_token: str) -> AsyncIterator[Call]:
    ws_url = url.replace("http://", "ws://") + "/ws"
    headers = {"Authorization": f"Bearer {orchestrator_token}"}
    async with websockets.connect(ws_url, additional_headers=headers) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {"episode": EPISODE}}))
        attached = json.loads(await ws.recv())
        assert attached["type"] == "observation", attached
        frame = json.dumps({"type": "step", "data": {"tool_name": "task_info", "arguments": {}}})

        async def call() -> str:
            await ws.send(frame)
            reply = json.loads(await ws.recv())
            if reply["type"] == "error":
                data = reply["data"]
                assert data.get("code") == "SERVICE_UNAVAILABLE" and data.get("retryable") is True, reply
                assert data.get("error_code") == UNAVAILABLE_CODE and data.get("retry_after_seconds", 0) >= 1
                return "refused"
            assert reply["type"] == "observation", reply
            assert reply["data"]["observation"]["error"] is None, reply
            return "served"

        yield call


async def test_a_restarted_api_server_costs_typed_retryable_refusals_and_no_lost_or_extra_step(
    own_cluster: devcluster.ClusterState, outage_gateway: tuple[str, str, str]
) -> None:
    url, agent_token, orchestrator_token = outage_gateway
    async with (
        sdk_client(url, agent_token) as sdk_call,
        rpc_client(url, agent_token) as rpc_call,
        ws_client(url, orchestrator_token) as ws_call,
    ):
        calls = {"mcp-sdk": sdk_call, "json-rpc": rpc_call, "openenv-ws": ws_call}
        tallies = await restart_under_load(own_cluster, calls)

    for name, tally in tallies.items():
        assert tally.served.get("down", 0) == 0, (name, tally)  # nothing is served without the server
        assert tally.refused.get("ready", 0) == 0, (name, tally)  # every call after the restart served
    served = sum(sum(t.served.values()) for t in tallies.values())
    episode = kubectl_json(make_kubectl(own_cluster), "-n", NAMESPACE, "get", "episode", EPISODE)
    steps = episode["status"]["steps"]
    print(f"served {served}, steps {steps}; " + "; ".join(f"{n}: {t}" for n, t in tallies.items()))
    assert steps == served


async def restart_under_load(state: devcluster.ClusterState, calls: dict[str, Call]) -> dict[str, Tally]:
    """Each client calls in a loop while the API server is stopped and started again; their tallies,
    checked free of faults."""
    outage = Outage()
    tallies = {name: Tally() for name in calls}
    loops = [asyncio.create_task(loop(n, calls[n], outage, t)) for n, t in tallies.items()]

    async def until(what: str, predicate: Callable[[Tally], bool]) -> None:
        async with asyncio.timeout(STATE_WITHIN_SECONDS):
            while not all(predicate(t) for t in tallies.values()):
                if any(t.faults for t in tallies.values()):
                    break
                await asyncio.sleep(0.05)
        faults = [f for t in tallies.values() for f in t.faults]
        assert not faults, f"while waiting for {what}: {faults[:5]}"

    try:
        await until("calls served", lambda t: t.served.get("up", 0) >= 3)
        await asyncio.to_thread(devcluster.stop_apiserver, state)
        outage.phase = "down"
        await until("refusals", lambda t: t.refused.get("down", 0) >= 2)
        outage.phase = "restarting"
        await asyncio.to_thread(devcluster.start_apiserver, state)
        outage.phase = "ready"
        await until("calls served after the restart", lambda t: t.served.get("ready", 0) >= 5)
    finally:
        outage.running = False
        await asyncio.gather(*loops)
    for name, tally in tallies.items():
        assert not tally.faults, (name, tally.faults[:5])
    return tallies
