"""Whole t0_artifact episodes with the real OpenEnv clients: openenv 0.10 (tool calls over HTTP /mcp
with a session id, reset/step over /ws) and openenv-core 0.3 (everything over /ws step). Both
generations install the same import package, so each gets its own venv in the user cache."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.integration.gateway.client_venvs import client_venv
from tests.integration.gateway.support import GatewayServer
from tests.integration.operator.test_full_episode import ARTIFACT_SCRIPT

HERE = Path(__file__).parent
# The clients' own code, unmodified; the servers' heavy extras (gradio, hub) are left out (--no-deps).
CLIENT_DEPS = ["pydantic", "fastapi", "websockets", "httpx", "requests", "fastmcp>=3,<4", "pyyaml"]
CLIENTS = {"openenv-0.10": "openenv==0.10.*", "openenv-core-0.3": "openenv-core==0.3.0"}


@pytest.mark.parametrize("name", sorted(CLIENTS))
def test_openenv_client_drives_t0_artifact_to_reward_one(
    name: str, executing_gateway: GatewayServer, tmp_path: Path
) -> None:
    venv = client_venv(name, ["--no-deps", CLIENTS[name]], CLIENT_DEPS)
    script = tmp_path / "answer.py"
    script.write_text(ARTIFACT_SCRIPT)
    proc = subprocess.run(
        [str(venv / "bin" / "python"), str(HERE / "openenv_client.py"), executing_gateway.url,
         executing_gateway.orchestrator_token, str(script)],
        capture_output=True, text=True, timeout=400, env={**os.environ, "NO_PROXY": "127.0.0.1,localhost"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["client"].startswith(name.rsplit("-", 1)[1])
    assert "agent_token" in summary["reset_metadata_keys"]
    assert "jobs_submit" in summary["tools"]
    assert summary["job_phase"] == "Succeeded" and summary["dev_score"] == "1"
    assert summary["done"] is True and summary["reward"] == 1.0
    spend = summary["metadata"]["service_spend"]
    assert spend["reserved_usd"] == "0.00" and spend["settled_usd"] != "0.00", spend
    # Every tool call counted, whichever path it took (HTTP /mcp for 0.10, /ws step for 0.3).
    assert summary["metadata"]["steps"] == summary["calls"] == summary["state_step_count"]
