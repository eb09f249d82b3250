"""Gateway throughput and latency against the devstack control plane.

    python bench/gateway.py [--devstack NAME] [--clients 100] [--seconds 10]

- `jobs_status` calls/s from N concurrent clients (OpenEnv `/mcp` tools/call, each a full choke-point
  pass: token -> episode GET, durable step count, AgentJob list) beside a bare FastAPI endpoint in the
  same process and run; the ratio; p50/p99 latency of each.
- The wake-up latency of `jobs_wait`: from the moment an AgentJob's status turns Succeeded (the status
  write returns) to the moment the waiting call answers.

No operator runs: the bench plays the operator's part by writing the Episode and AgentJob itself.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import secrets
import statistics
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import uvicorn

from devstack import cluster as devcluster
from env_gateway.config import GatewaySettings
from env_gateway.main import create_app

REPO = Path(__file__).resolve().parents[1]


def kubectl(state: devcluster.ClusterState, *args: str, input: str | None = None) -> str:
    proc = subprocess.run(
        [str(state.kubectl()), f"--kubeconfig={state.kubeconfig}", *args],
        capture_output=True, text=True, input=input, check=True, timeout=60,
    )  # fmt: skip
    return proc.stdout


def serve(settings: GatewaySettings) -> tuple[str, uvicorn.Server, threading.Thread]:
    app = create_app(settings)

    @app.get("/bare")
    async def bare() -> dict[str, bool]:
        return {"ok": True}

    port = devcluster.free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.02)
    return f"http://127.0.0.1:{port}", server, thread


async def load(url: str, clients: int, seconds: float, request: Any) -> tuple[float, list[float]]:
    latencies: list[float] = []
    stop = time.perf_counter() + seconds
    limits = httpx.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=60) as http:

        async def worker() -> None:
            while time.perf_counter() < stop:
                start = time.perf_counter()
                response = await request(http)
                response.raise_for_status()
                latencies.append(time.perf_counter() - start)

        began = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(clients)))
        elapsed = time.perf_counter() - began
    return len(latencies) / elapsed, latencies


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--devstack", default="default")
    parser.add_argument("--clients", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--wakeups", type=int, default=10)
    opts = parser.parse_args()
    state = devcluster.load_state(opts.devstack)
    assert state is not None, f"no devstack cluster {opts.devstack!r}: make cluster-up"
    kubectl(state, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl(state, "create", "namespace", namespace)
    token = secrets.token_urlsafe(32)
    episode = {
        "apiVersion": "posttrain.dev/v1alpha1", "kind": "Episode", "metadata": {"name": "bench"},
        "spec": {"task": "t0_artifact", "budgetUSD": "1", "backend": "hf-jobs",
                 "limits": {"maxSteps": 100000},
                 "agentTokenHash": hashlib.sha256(token.encode()).hexdigest()},
    }  # fmt: skip
    kubectl(state, "-n", namespace, "apply", "-f", "-", input=json.dumps(episode))
    token_file = Path(tempfile.mkdtemp()) / "token"
    token_file.write_text("unused")
    settings = GatewaySettings(
        namespace=namespace, orchestrator_token=secrets.token_urlsafe(16),  # type: ignore[arg-type]
        kubeconfig=str(state.kubeconfig), broker_token_file=str(token_file),
    )  # fmt: skip
    url, server, thread = serve(settings)
    auth = {"Authorization": f"Bearer {token}"}
    status_call = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "jobs_status"}}
    try:
        await load(url, 10, 1.0, lambda h: h.get("/bare"))  # warm-up
        bare_rate, bare_lat = await load(url, opts.clients, opts.seconds, lambda h: h.get("/bare"))
        tool_rate, tool_lat = await load(
            url, opts.clients, opts.seconds, lambda h: h.post("/mcp", json=status_call, headers=auth)
        )
        print(f"clients: {opts.clients}, {opts.seconds:.0f} s each")
        for label, rate, lat in (
            ("bare FastAPI endpoint", bare_rate, bare_lat),
            ("jobs_status tool call", tool_rate, tool_lat),
        ):
            print(f"{label}: {rate:8.1f} req/s  p50 {pct(lat, 0.5):7.1f} ms  p99 {pct(lat, 0.99):7.1f} ms")
        print(f"ratio jobs_status / bare: {tool_rate / bare_rate:.3f}")
        wakeups = []
        async with httpx.AsyncClient(base_url=url, headers=auth, timeout=60) as http:
            for i in range(opts.wakeups):
                job = {
                    "apiVersion": "posttrain.dev/v1alpha1", "kind": "AgentJob", "metadata": {"name": f"w{i}"},
                    "spec": {"episode": "bench", "purpose": "train", "script": "print(1)",
                             "flavor": "cpu-basic", "timeoutSeconds": 60},
                }  # fmt: skip
                kubectl(state, "-n", namespace, "apply", "-f", "-", input=json.dumps(job))
                arguments = {"job": f"w{i}", "timeout_seconds": 20}
                wait = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
                        "params": {"name": "jobs_wait", "arguments": arguments}}  # fmt: skip
                waiting = asyncio.create_task(http.post("/mcp", json=wait))
                await asyncio.sleep(1.0)  # the call is now inside its watch
                patch = json.dumps({"status": {"phase": "Succeeded"}})
                await asyncio.to_thread(
                    kubectl, state, "-n", namespace, "patch", "agentjob", f"w{i}", "--subresource=status",
                    "--type=merge", "-p", patch,
                )  # fmt: skip
                written = time.perf_counter()
                answer = (await waiting).json()
                woke = time.perf_counter()
                assert answer["result"]["structuredContent"]["finished"], answer
                wakeups.append(woke - written)
        print(f"jobs_wait wake-up after the status write returned: p50 {pct(wakeups, .5):.1f} ms, "
              f"max {max(wakeups) * 1000:.1f} ms (n={len(wakeups)})")  # fmt: skip
        print(
            f"mean jobs_status latency {statistics.mean(tool_lat) * 1000:.1f} ms over {len(tool_lat)} calls"
        )
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        kubectl(state, "delete", "namespace", namespace, "--wait=false")


if __name__ == "__main__":
    asyncio.run(main())
