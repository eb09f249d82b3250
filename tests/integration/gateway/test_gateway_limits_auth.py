"""The choke point: direct /mcp tool calls count toward maxSteps exactly like WS step() calls and are
refused past the limit; and the auth matrix on both surfaces, with nothing created by a refusal."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import websockets

from tests.helpers import Kubectl
from tests.integration.gateway.support import GatewayServer, orchestrator
from tests.integration.support import get


def rpc(
    gw: GatewayServer, token: str | None, method: str, params: dict[str, Any] | None = None, **headers: str
) -> httpx.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": params or {}}
    return httpx.post(f"{gw.url}/mcp", json=body, headers=headers, timeout=30)


def call(gw: GatewayServer, token: str, tool: str, **arguments: Any) -> dict[str, Any]:
    response = rpc(gw, token, "tools/call", {"name": tool, "arguments": arguments})
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()["result"]
    return result


def counts(kubectl: Kubectl, namespace: str) -> tuple[int, int]:
    episodes = json.loads(kubectl("-n", namespace, "get", "episodes", "-o", "json").stdout)["items"]
    jobs = json.loads(kubectl("-n", namespace, "get", "agentjobs", "-o", "json").stdout)["items"]
    return len(episodes), len(jobs)


async def test_direct_mcp_calls_count_like_step_calls_and_stop_at_the_limit(
    gateway: GatewayServer, kubectl: Kubectl
) -> None:
    async with orchestrator(gateway) as orch:
        reset = await orch.reset(task="t0_artifact", max_steps=5)
        token = reset["observation"]["metadata"]["agent_token"]
        episode = reset["observation"]["episode"]
        assert reset["metadata"]["steps_left"] == 5

        first = await orch.call("jobs_status")
        assert first["metadata"]["steps_left"] == 4 and first["observation"]["metadata"]["steps"] == 1
        assert call(gateway, token, "jobs_status")["_meta"]["metadata"]["steps"] == 2
        assert (await orch.call("task_info"))["metadata"]["steps"] == 3
        call(gateway, token, "jobs_status")
        last = call(gateway, token, "task_info")
        assert last["_meta"]["metadata"]["steps_left"] == 0 and not last["isError"]
        assert get(kubectl, gateway.namespace, "episode", episode)["status"]["steps"] == 5

        refused = call(gateway, token, "jobs_status")
        assert refused["isError"] and refused["structuredContent"]["error"]["code"] in {
            "step_limit_reached", "episode_done"
        }  # fmt: skip
        assert refused["_meta"]["done"] is True and refused["_meta"]["reward"] == 0.0
        over_ws = await orch.call("jobs_status")
        assert over_ws["done"] is True and over_ws["observation"]["error"]["error_type"] == "execution_error"
        assert over_ws["observation"]["result"] is None
    # Refusals are not counted.
    assert get(kubectl, gateway.namespace, "episode", episode)["status"]["steps"] == 5


async def test_auth_matrix_refuses_and_creates_nothing(gateway: GatewayServer, kubectl: Kubectl) -> None:
    async with orchestrator(gateway) as orch:
        a = (await orch.reset(task="t0_artifact"))["observation"]
        b = (await orch.reset(task="t0_artifact"))["observation"]
    token_a, token_b = a["metadata"]["agent_token"], b["metadata"]["agent_token"]
    submitted = call(gateway, token_b, "jobs_submit", script="print(1)", timeout_seconds=60)
    assert not submitted["isError"], submitted
    job_b = submitted["structuredContent"]["job"]
    before = counts(kubectl, gateway.namespace)
    steps_before = get(kubectl, gateway.namespace, "episode", a["episode"])["status"]["steps"]
    submit = {"name": "jobs_submit", "arguments": {"script": "print(2)", "timeout_seconds": 60}}

    missing = rpc(gateway, None, "tools/call", submit)
    assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_token"
    wrong = rpc(gateway, "not-a-token", "tools/call", submit)
    assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_token"
    orch_on_agent = rpc(gateway, gateway.orchestrator_token, "tools/call", submit)
    assert orch_on_agent.status_code == 403 and orch_on_agent.json()["error"]["code"] == "wrong_surface"
    # The MCP SDK transport (initialize) is the agent surface too.
    sdk_init = rpc(
        gateway, gateway.orchestrator_token, "initialize", Accept="application/json, text/event-stream"
    )
    assert sdk_init.status_code == 403
    # And so are the self-contained requests of the 2026 era: refused before the SDK sees them.
    modern = {"Accept": "application/json", "Mcp-Protocol-Version": "2026-07-28"}
    for token, status, code in (
        (None, 401, "missing_token"),
        ("not-a-token", 401, "invalid_token"),
        (gateway.orchestrator_token, 403, "wrong_surface"),
    ):
        refused = rpc(gateway, token, "tools/call", submit, **modern)
        assert refused.status_code == status and refused.json()["error"]["code"] == code, refused.text
    # Another episode's token reaches only its own episode: B's job is invisible to A, and cancelling
    # it with A's token fails.
    foreign = call(gateway, token_a, "jobs_cancel", job=job_b["name"])
    assert foreign["isError"] and foreign["structuredContent"]["error"]["code"] == "job_not_found"
    # An OpenEnv session bound to episode A refuses B's agent token.
    session = rpc(gateway, gateway.orchestrator_token, "openenv/session/create").json()["result"][
        "session_id"
    ]
    async with websockets.connect(
        f"{gateway.ws_url}?session_id={session}", additional_headers=gateway.orchestrator_headers()
    ) as ws:
        await ws.send(json.dumps({"type": "reset", "data": {"episode": a["episode"]}}))
        json.loads(await ws.recv())
        cross = rpc(gateway, token_b, "tools/call", {**submit, "session_id": session})
        assert cross.status_code == 403 and cross.json()["error"]["code"] == "wrong_episode"
    # Session methods are the orchestrator's.
    assert rpc(gateway, token_a, "openenv/session/create").status_code == 401

    # The orchestrator surface refuses agent tokens, wrong tokens and no token.
    for headers in ({}, {"Authorization": f"Bearer {token_a}"}, {"Authorization": "Bearer nope"}):
        with pytest.raises(websockets.InvalidStatus) as refused:
            async with websockets.connect(gateway.ws_url, additional_headers=headers):
                pass
        assert refused.value.response.status_code == 401

    assert counts(kubectl, gateway.namespace) == before
    assert (
        get(kubectl, gateway.namespace, "agentjob", job_b["name"])["metadata"].get("deletionTimestamp")
        is None
    )
    # Only the one legitimate call of the foreign-job probe counted (a refused lookup is a step).
    assert get(kubectl, gateway.namespace, "episode", a["episode"])["status"]["steps"] == steps_before + 1
