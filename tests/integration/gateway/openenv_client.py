"""Drives a whole t0_artifact episode with an unmodified OpenEnv client (openenv 0.10 or openenv-core
0.3), as a trainer would. Runs in that client's own venv, as a subprocess of the test:

    python openenv_client.py BASE_URL ORCHESTRATOR_TOKEN SCRIPT_FILE

and prints one JSON summary line. Only the client's public API is used."""

import asyncio
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from openenv.core.env_server.mcp_types import CallToolAction
from openenv.core.mcp_client import MCPToolClient


def generation() -> str:
    try:
        return version("openenv")
    except PackageNotFoundError:
        return version("openenv-core")


def client(base_url: str, token: str) -> MCPToolClient:
    if generation().startswith("0.10"):
        return MCPToolClient(base_url=base_url, headers={"Authorization": f"Bearer {token}"})
    # 0.3 clients cannot set headers; the URL's userinfo becomes HTTP Basic auth on the WS handshake.
    parts = urlsplit(base_url)
    return MCPToolClient(base_url=urlunsplit(parts._replace(netloc=f"orchestrator:{token}@{parts.netloc}")))


async def main() -> None:
    base_url, token, script = sys.argv[1:4]
    summary = {"client": generation()}
    async with client(base_url, token) as env:
        reset = await env.reset(task="t0_artifact", budget_usd="0.05")
        summary["reset_metadata_keys"] = sorted(reset.observation.metadata)
        summary["tools"] = sorted(t.name for t in await env.list_tools())
        calls = 0

        async def call(name, **arguments):
            nonlocal calls
            calls += 1
            return await env.call_tool(name, **arguments)

        job = (await call("jobs_submit", script=script, timeout_seconds=300))["job"]["name"]
        waited = {"finished": False}
        while not waited["finished"]:
            waited = await call("jobs_wait", job=job, timeout_seconds=20)
        summary["job_phase"] = waited["job"]["phase"]
        dev = (await call("dev_evaluate", job=job))["job"]["name"]
        waited = {"finished": False}
        while not waited["finished"]:
            waited = await call("jobs_wait", job=dev, timeout_seconds=20)
        summary["dev_score"] = waited["job"]["result"]["score"]
        await call("submit", job=job)
        # The reward comes with the final observation, through step() (call_tool returns data only).
        while True:
            calls += 1
            result = await env.step(CallToolAction(tool_name="jobs_wait", arguments={"timeout_seconds": 20}))
            if result.done:
                break
        summary["done"] = result.done
        summary["reward"] = result.reward
        summary["metadata"] = result.observation.metadata
        summary["calls"] = calls
        state = await env.state()
        summary["state_step_count"] = state.step_count
    print(json.dumps(summary))


if __name__ == "__main__":
    sys.argv[3] = Path(sys.argv[3]).read_text()
    asyncio.run(main())
