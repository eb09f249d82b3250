"""A whole t0_artifact episode driven by an agent on the official MCP SDK over streamable HTTP, once per
SDK generation: the 2.x of the project's lock (2026 requests, no session) and a pinned 1.x (the 2025
handshake and a session), in its own venv. The orchestrator resets over /ws and hands the agent token
over; the agent does the rest through MCP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.gateway.client_venvs import client_venv
from tests.integration.gateway.support import GatewayServer, orchestrator
from tests.integration.operator.test_full_episode import ARTIFACT_SCRIPT

HERE = Path(__file__).parent
MCP_V1 = "1.30.0"  # the last 1.x release
TOOL_NAMES = [
    "dev_evaluate", "jobs_cancel", "jobs_logs", "jobs_read_artifact", "jobs_status", "jobs_submit",
    "jobs_wait", "submit", "task_info",
]  # fmt: skip


def _python(generation: str) -> str:
    if generation == "2.x":
        return sys.executable  # the project's own venv: the SDK its gateway serves with
    return str(client_venv(f"mcp-{MCP_V1}", [f"mcp=={MCP_V1}"]) / "bin" / "python")


@pytest.mark.parametrize(("generation", "protocol"), [("1.x", "2025-11-25"), ("2.x", "2026-07-28")])
async def test_mcp_sdk_agent_drives_t0_artifact_to_reward_one(
    generation: str, protocol: str, executing_gateway: GatewayServer, tmp_path: Path
) -> None:
    python = await asyncio.to_thread(_python, generation)
    async with orchestrator(executing_gateway) as orch:
        reset = await orch.reset(task="t0_artifact", budget_usd="0.05")
    token = reset["observation"]["metadata"]["agent_token"]
    assert reset["observation"]["task"]["name"] == "t0_artifact"
    assert "hidden" not in json.dumps(reset["observation"]["task"])
    script = tmp_path / "answer.py"
    script.write_text(ARTIFACT_SCRIPT)

    proc = await asyncio.to_thread(
        subprocess.run,
        [python, str(HERE / "mcp_agent.py"), executing_gateway.url, token, str(script)],
        capture_output=True, text=True, timeout=400, env={**os.environ, "NO_PROXY": "127.0.0.1,localhost"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])

    assert summary["client"].startswith(generation[0] + "."), summary["client"]
    assert summary["protocol"] == protocol  # the era the SDK generation speaks, served by the gateway
    assert summary["tools"] == TOOL_NAMES
    assert summary["task"] == "t0_artifact" and summary["budget_usd"] == "0.05"
    assert summary["submitted_phase"] in {"Admitted", "Running", "Succeeded"}
    assert summary["reserved_after_submit"] != "0.00"
    assert (summary["job"]["phase"], summary["job"]["exit_code"]) == ("Succeeded", 0), summary["job"]
    assert any("wrote" in line for line in summary["log_lines"]), summary.get("log_lines")
    assert summary["dev_score"] == "1"
    final, meta = summary["final"], summary["final_meta"]
    assert final["outcome"] == "Scored" and final["reward"] == "1"
    assert meta["done"] is True and meta["reward"] == 1.0
    spend = meta["metadata"]["service_spend"]
    assert spend["reserved_usd"] == "0.00" and spend["settled_usd"] != "0.00", spend
    # Every tool call was counted once, whichever era carried it.
    assert meta["metadata"]["steps"] == summary["calls"] - 1  # all but the refused call after the end
    after = summary["after_end"]
    assert after["isError"] and after["structuredContent"]["error"]["code"] == "episode_done"
