"""Loopback networking on the HF Jobs emulator, as an agent meets it: task_info and jobs_status say
the mode and why; torchrun's TCPStore with a gloo all-reduce, a localhost HTTP server and getifaddrs
work inside a job; a hostile job reaches nothing of the machine outside its namespace."""

from __future__ import annotations

import json
from typing import Any

from tests.integration.gateway.agent_steps import finished, result
from tests.integration.gateway.support import GatewayServer, Orchestrator, orchestrator
from tests.integration.launcher.support import job_script
from tests.integration.launcher.test_launcher_loopback import Canary, _host_addresses


async def _read(orch: Orchestrator, job: str, path: str) -> Any:
    return json.loads(result(await orch.call("jobs_read_artifact", job=job, path=path))["text"])


async def _run(orch: Orchestrator, script: str) -> tuple[dict[str, Any], list[str]]:
    name = result(await orch.call("jobs_submit", script=script, timeout_seconds=300))["job"]["name"]
    job = await finished(orch, name, wait_seconds=60)
    logs = result(await orch.call("jobs_logs", job=name, tail=200))["lines"]
    return job, logs


async def test_a_job_on_the_emulator_gets_loopback_and_no_way_out(executing_gateway: GatewayServer) -> None:
    canary = Canary()
    try:
        targets = [[f"host {a}", a, canary.port] for a in _host_addresses()]
        hostile = job_script("loopback_hostile.py", TARGETS=json.dumps(targets))
        async with orchestrator(executing_gateway) as orch:
            await orch.reset(task="t0_artifact", budget_usd="0.50")
            network = result(await orch.call("task_info"))["episode"]["network"]
            assert network["mode"] == "loopback" and "lo alone" in network["reason"]

            job, logs = await _run(orch, job_script("loopback_stack.py"))
            assert job["phase"] == "Succeeded" and job["network"] == "loopback", logs
            assert "posttrain-launcher: network: loopback" in "\n".join(logs)
            stack = await _read(orch, job["name"], "result.json")
            assert stack["sum"] == ["all-reduce sum 3.0"], logs
            assert stack["http"] == "hello from localhost" and stack["getifaddrs"] == ["lo"]

            job, logs = await _run(orch, hostile)
            assert job["phase"] == "Succeeded", logs
            found = await _read(orch, job["name"], "result.json")
    finally:
        canary.close()
    assert found.pop("interfaces") == "open: ['lo']"
    assert {n: o for n, o in found.items() if not o.startswith("refused")} == {}, found
    assert found["raw inet"] == found["packet"] == found["vsock"] == "refused: EACCES"
    assert found["unshare(CLONE_NEWUSER|CLONE_NEWNET)"] == "refused: EACCES"
    assert canary.hits == []
