"""A wait as long as a job: one jobs_wait call, through the MCP SDK's client with its default read
timeout, returns when the job ends, well past the 30 s some clients give a request, and counts one
step; a wait on several jobs returns at the first change of any of them."""

from __future__ import annotations

from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.integration.gateway.support import GatewayServer, orchestrator

# The MCP SDK's own default: 30 s to connect or write, 300 s to read an answer.
SDK_DEFAULT_TIMEOUT = httpx2.Timeout(30, read=300)
SLEEPER = "import time\nprint('sleeping', flush=True)\ntime.sleep(45)\nprint('awake')"


async def test_one_jobs_wait_lasts_until_the_job_ends_and_counts_one_step(
    executing_gateway: GatewayServer,
) -> None:
    async with orchestrator(executing_gateway) as orch:
        reset = await orch.reset(task="t0_artifact", budget_usd="0.05")
    headers = {"Authorization": f"Bearer {reset['observation']['metadata']['agent_token']}"}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=SDK_DEFAULT_TIMEOUT) as http,
        Client(streamable_http_client(f"{executing_gateway.url}/mcp", http_client=http)) as client,
    ):

        async def call(tool: str, **arguments: Any) -> tuple[dict[str, Any], int]:
            answer = (await client.call_tool(tool, arguments)).model_dump(mode="json", by_alias=True)
            assert not answer["isError"], answer
            return answer["structuredContent"], answer["_meta"]["metadata"]["steps"]

        submitted, _ = await call("jobs_submit", script=SLEEPER, timeout_seconds=300)
        sleeper = submitted["job"]["name"]
        other, _ = await call("jobs_submit", script="print(1)", timeout_seconds=120)
        # Several jobs: the first change of either ends the wait (the short job starts or ends first).
        changed, _ = await call("jobs_wait", jobs=[sleeper, other["job"]["name"]], timeout_seconds=240)
        assert changed["changed"] and set(changed["changed"]) <= {sleeper, other["job"]["name"]}
        assert {j["name"] for j in changed["jobs"]} == {sleeper, other["job"]["name"]}

        status, before = await call("jobs_status", job=sleeper)
        assert status["jobs"][0]["phase"] in {"Admitted", "Running"}
        waited, after = await call("jobs_wait", job=sleeper, timeout_seconds=240)
        assert waited["finished"] and waited["job"]["phase"] == "Succeeded", waited
        assert after == before + 1  # one step for the whole wait
        logs, _ = await call("jobs_logs", job=sleeper)
        assert logs["lines"][-1] == "awake"
