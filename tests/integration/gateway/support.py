"""Gateway test helpers: the gateway as a real process on a free port, an MCP orchestrator client,
episode snapshots."""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
from collections.abc import Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
import websockets

from devstack.controlplane import cluster as devcluster
from env_gateway.config import GatewaySettings
from env_gateway.main import create_app
from tests.helpers import Kubectl, wait_for
from tests.integration.support import OperatorProcess


@dataclass
class GatewayServer:
    url: str
    orchestrator_token: str
    namespace: str

    @property
    def ws_url(self) -> str:
        return self.url.replace("http://", "ws://") + "/ws"

    def orchestrator_headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.orchestrator_token}"}


RESET_START_WAIT_SECONDS = 120


REPLY_TIMEOUT_SECONDS = RESET_START_WAIT_SECONDS + 60  # a reset's reply comes after its wait


def serve(settings: GatewaySettings) -> Iterator[str]:
    port = devcluster.free_port()
    config = uvicorn.Config(
        create_app(settings),
        host="127.0.0.1",
        port=port,
        log_level="warning",
        lifespan="on",
        ws="websockets-sansio",
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, name="gateway", daemon=True)
    thread.start()

    def started() -> bool:
        if not thread.is_alive():
            raise RuntimeError("the gateway failed to start")
        return bool(server.started)

    # A state, not a count of polls: a loaded machine can take many seconds to start uvicorn.
    wait_for(started, timeout=180, interval=0.05, what="the gateway to listen")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(timeout=15)


def gateway_settings(
    namespace: str, op: OperatorProcess, token_file: Path, cluster: devcluster.ClusterState, token: str
) -> GatewaySettings:
    return GatewaySettings(
        namespace=namespace,
        orchestrator_token=token,  # type: ignore[arg-type]
        broker_url=op.broker_url,
        broker_token_file=str(token_file),
        kubeconfig=str(cluster.kubeconfig),
        # The most a loaded machine may take for the operator to start an episode or admit a job.
        reset_start_wait_seconds=RESET_START_WAIT_SECONDS,
        submit_admission_wait_seconds=20,
    )


def gateway_beside(
    op: OperatorProcess, cluster: devcluster.ClusterState, namespace: str, token_file: Path
) -> Iterator[GatewayServer]:
    """A gateway served beside `op`, with an orchestrator token of its own."""
    token = secrets.token_urlsafe(24)
    for url in serve(gateway_settings(namespace, op, token_file, cluster, token)):
        yield GatewayServer(url, token, namespace)


class Orchestrator:
    """A minimal OpenEnv WS client for tests (one reply per frame, in order)."""

    def __init__(self, conn: websockets.ClientConnection) -> None:
        self.conn = conn

    async def send(self, message: dict[str, Any]) -> dict[str, Any]:
        await self.conn.send(json.dumps(message))
        reply: dict[str, Any] = json.loads(await asyncio.wait_for(self.conn.recv(), REPLY_TIMEOUT_SECONDS))
        return reply

    async def reset(self, **kwargs: Any) -> dict[str, Any]:
        reply = await self.send({"type": "reset", "data": kwargs})
        assert reply["type"] == "observation", reply
        return reply["data"]

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        reply = await self.send(
            {"type": "step", "data": {"type": "call_tool", "tool_name": tool, "arguments": arguments}}
        )
        assert reply["type"] == "observation", reply
        return reply["data"]


@asynccontextmanager
async def orchestrator(gw: GatewayServer) -> Any:
    async with websockets.connect(gw.ws_url, additional_headers=gw.orchestrator_headers()) as conn:
        yield Orchestrator(conn)


async def new_episode(gw: GatewayServer) -> tuple[str, str]:
    """A fresh t0_artifact episode: (its name, its agent token)."""
    async with orchestrator(gw) as orch:
        observation = (await orch.reset(task="t0_artifact"))["observation"]
    return observation["episode"], observation["metadata"]["agent_token"]


def snapshot(kubectl: Kubectl, namespace: str) -> tuple[Any, ...]:
    """What a refused request must not change: every Episode's spec and step count, every AgentJob."""
    episodes = json.loads(kubectl("-n", namespace, "get", "episodes", "-o", "json").stdout)["items"]
    jobs = json.loads(kubectl("-n", namespace, "get", "agentjobs", "-o", "json").stdout)["items"]
    return (
        sorted(
            (
                e["metadata"]["name"],
                json.dumps(e["spec"], sort_keys=True),
                e.get("status", {}).get("steps") or 0,
            )
            for e in episodes  # the operator may write the default 0 into a status without steps
        ),
        sorted((j["metadata"]["name"], json.dumps(j["spec"], sort_keys=True)) for j in jobs),
    )
