"""An agent on the official MCP SDK, of either generation, driving a t0_artifact episode over streamable
HTTP from the agent token on: 1.x (the 2025 `initialize` handshake, then a session) or 2.x (its default
connect: a `server/discover` probe, then self-contained 2026 requests). Runs under the interpreter of
the venv that holds that generation, as a subprocess of the test:

    python mcp_agent.py BASE_URL AGENT_TOKEN SCRIPT_FILE

and prints one JSON summary line. Only the SDK's public API is used."""

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

GENERATION = version("mcp")
# (tool name, arguments) -> the CallToolResult as the wire has it (camelCase keys).
Call = Callable[[str, dict[str, Any]], Awaitable[dict[str, Any]]]


@contextlib.asynccontextmanager
async def connect(url: str, token: str) -> AsyncIterator[tuple[Call, list[str], str]]:
    """(call, tool names, negotiated protocol version) on a connected client."""
    headers = {"Authorization": f"Bearer {token}"}
    if GENERATION.startswith("1."):
        import httpx
        from mcp import ClientSession
        from mcp.client.streamable_http import streamable_http_client

        async with (
            httpx.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(url, http_client=http) as (read, write, _),
            ClientSession(read, write) as session,
        ):
            initialized = await session.initialize()
            names = [t.name for t in (await session.list_tools()).tools]

            async def call_v1(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
                return (await session.call_tool(name, arguments)).model_dump(mode="json", by_alias=True)

            yield call_v1, names, str(initialized.protocolVersion)
        return
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client as streamable_http_client_v2

    async with (
        httpx2.AsyncClient(headers=headers, timeout=60) as http2,
        Client(streamable_http_client_v2(url, http_client=http2)) as client,
    ):
        names = [t.name for t in (await client.list_tools()).tools]

        async def call_v2(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
            return (await client.call_tool(name, arguments)).model_dump(mode="json", by_alias=True)

        yield call_v2, names, client.protocol_version


async def main(url: str, token: str, script: str) -> dict[str, Any]:
    summary: dict[str, Any] = {"client": GENERATION, "calls": 0}
    async with connect(f"{url}/mcp", token) as (raw_call, names, protocol):
        summary["tools"], summary["protocol"] = sorted(names), protocol

        async def call(tool: str, **arguments: Any) -> tuple[dict[str, Any], dict[str, Any]]:
            summary["calls"] += 1
            result = await raw_call(tool, arguments)
            if result.get("isError") or result.get("structuredContent") is None:
                raise AssertionError(f"{tool}: {result}")
            return result["structuredContent"], result.get("_meta") or {}

        async def wait(job: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
            waited: dict[str, Any] = {"finished": False}
            while not waited["finished"]:
                waited, meta = await call("jobs_wait", timeout_seconds=20, **({"job": job} if job else {}))
            return waited, meta

        info, meta = await call("task_info")
        summary["task"], summary["budget_usd"] = info["name"], meta["metadata"]["service_spend"]["budget_usd"]
        submitted, meta = await call("jobs_submit", script=script, timeout_seconds=300)
        job = submitted["job"]["name"]
        summary["submitted_phase"] = submitted["job"]["phase"]
        summary["reserved_after_submit"] = meta["metadata"]["service_spend"]["reserved_usd"]
        waited, _ = await wait(job)
        summary["job"] = waited["job"]
        # The operator's broker can answer 500 for an emulator job that just finished; ask again.
        for _ in range(3):
            summary["calls"] += 1
            logs = await raw_call("jobs_logs", {"job": job, "tail": 50})
            if not logs.get("isError") and logs.get("structuredContent"):
                summary["log_lines"] = logs["structuredContent"]["lines"]
                break
        dev, _ = await call("dev_evaluate", job=job)
        waited, _ = await wait(dev["job"]["name"])
        summary["dev_score"] = waited["job"]["result"]["score"]
        await call("submit", job=job)
        final, meta = await wait()
        summary["final"], summary["final_meta"] = final, meta
        # After the end every tool call is refused with a typed error.
        summary["calls"] += 1
        summary["after_end"] = await raw_call("jobs_status", {})
    return summary


if __name__ == "__main__":
    base_url, agent_token, script_file = sys.argv[1:4]
    print(json.dumps(asyncio.run(main(base_url, agent_token, Path(script_file).read_text()))))
