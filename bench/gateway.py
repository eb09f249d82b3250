"""Gateway throughput and latency, with the load generated outside the server.

    python bench/gateway.py [--devstack NAME] [--seconds 8] [--concurrency 1,4,16,64,128]

The gateway runs as the chart deploys it (`python -m uvicorn --factory env_gateway.main:app_from_env
--ws=websockets-sansio`: one process, h11, access log on), pinned to one core. The load comes from
`hey` (built once from the Go module proxy into the cache), a process of its own pinned to the other
core. At each concurrency, one timed run per endpoint:

- `GET /health`, the bare endpoint of the same app in the same server;
- `POST /mcp` `tools/call jobs_status` (the OpenEnv dialect), the whole choke point: the token's
  Episode and the AgentJob list (from the gateway's watch-fed copies), a durable step count
  (group-committed across concurrent callers: the call's one API request);
- for reference, `GET /` of a one-route FastAPI app under the same uvicorn settings, started the
  same way: what uvicorn serves on this machine.

Then the wake-up latency of `jobs_wait`: from the return of the status write that makes a job
Succeeded to the answer of a call already blocked waiting for it. No operator runs: the bench plays
its part by writing the Episode and AgentJobs itself.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import hashlib
import io
import json
import os
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator"), str(REPO / "launcher_image")]

from devstack.controlplane import cluster as devcluster  # noqa: E402
from devstack.toolchain.paths import cache_root  # noqa: E402

HEY_VERSION = "v0.1.5"
STATUS_CALL = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": "jobs_status"}}


def hey_binary() -> Path:
    """`hey`, built from the Go module proxy into the cache on first use (keyed by version)."""
    target = cache_root() / "tools" / f"hey-{HEY_VERSION}"
    binary = target / "hey"
    if not binary.exists():
        if shutil.which("go") is None:
            raise SystemExit("building hey needs a Go toolchain on PATH")
        env = {**os.environ, "GOBIN": str(target), "CGO_ENABLED": "0", "GOTOOLCHAIN": "local"}
        subprocess.run(["go", "install", f"github.com/rakyll/hey@{HEY_VERSION}"], env=env, check=True)
    return binary


def pinned(core: int) -> list[str]:
    """Run on one core when there are two or more (taskset), so server and load never share one."""
    return ["taskset", "-c", str(core)] if shutil.which("taskset") and (os.cpu_count() or 1) > 1 else []


@dataclass(frozen=True)
class Run:
    rate: float
    p50_ms: float
    p99_ms: float
    errors: int


def hey(url: str, concurrency: int, seconds: float, *args: str) -> Run:
    """One timed run; latencies from hey's per-request CSV (200s only), the rate over the run."""
    command = [*pinned(1), str(hey_binary()), "-z", f"{seconds}s", "-c", str(concurrency), "-cpus", "1",
               "-o", "csv", *args, url]  # fmt: skip
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    rows = list(csv.DictReader(io.StringIO(out)))
    ok = [r for r in rows if r["status-code"] == "200"]
    if not ok:
        raise RuntimeError(f"no successful request to {url}: {out[-500:]}")
    latencies = sorted(float(r["response-time"]) for r in ok)
    elapsed = max(float(r["offset"]) + float(r["response-time"]) for r in rows)
    return Run(
        rate=len(ok) / elapsed,
        p50_ms=latencies[len(latencies) // 2] * 1000,
        p99_ms=latencies[min(len(latencies) - 1, int(0.99 * len(latencies)))] * 1000,
        errors=len(rows) - len(ok),
    )


@contextlib.contextmanager
def uvicorn(app: list[str], port: int, env: dict[str, str], log: Path) -> Iterator[str]:
    """`python -m uvicorn` as the chart runs it, on one core; yields its base URL."""
    command = [*pinned(0), sys.executable, "-m", "uvicorn", *app, "--host=127.0.0.1", f"--port={port}",
               "--ws=websockets-sansio"]  # fmt: skip
    with log.open("wb") as out:
        proc = subprocess.Popen(command, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT,
                                cwd=REPO)  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/health" if "--factory" in app else url, timeout=2).status_code == 200:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=15)


def kubectl(state: devcluster.ClusterState, *args: str, input: str | None = None) -> str:
    proc = subprocess.run(
        [str(state.kubectl()), f"--kubeconfig={state.kubeconfig}", *args],
        capture_output=True, text=True, input=input, check=True, timeout=60,
    )  # fmt: skip
    return proc.stdout


async def wakeups(
    state: devcluster.ClusterState, namespace: str, url: str, token: str, count: int
) -> list[float]:
    seen = []
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=60
    ) as http:
        for i in range(count):
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
            await asyncio.sleep(1.0)  # the call is now waiting
            patch = json.dumps({"status": {"phase": "Succeeded"}})
            await asyncio.to_thread(
                kubectl, state, "-n", namespace, "patch", "agentjob", f"w{i}", "--subresource=status",
                "--type=merge", "-p", patch,
            )  # fmt: skip
            written = time.perf_counter()
            answer = (await waiting).json()
            seen.append(time.perf_counter() - written)
            assert answer["result"]["structuredContent"]["finished"], answer
    return seen


def bench_episode(state: devcluster.ClusterState) -> tuple[str, str]:
    """A fresh namespace with the Episode `bench` in it: (the namespace, the Episode's agent token)."""
    kubectl(state, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    kubectl(state, "create", "namespace", namespace)
    token = secrets.token_urlsafe(32)
    digest = hashlib.sha256(token.encode()).hexdigest()
    episode = {
        "apiVersion": "posttrain.dev/v1alpha1", "kind": "Episode", "metadata": {"name": "bench"},
        "spec": {"task": "t0_artifact", "budgetUSD": "1", "backend": "hf-jobs",
                 "limits": {"maxSteps": 100000}, "agentTokenHash": digest},
    }  # fmt: skip
    kubectl(state, "-n", namespace, "apply", "-f", "-", input=json.dumps(episode))
    return namespace, token


def report(rows: list[tuple[int, Run, Run, Run]], woke: list[float]) -> None:
    print(f"{'clients':>7}  {'reference req/s':>15} {'p99':>7}  {'/health req/s':>13} {'p50':>6} {'p99':>7}"
          f"  {'jobs_status req/s':>17} {'p50':>6} {'p99':>7}  {'ratio':>5}")  # fmt: skip
    for c, ref, bare, tool in rows:
        print(f"{c:>7}  {ref.rate:>15.0f} {ref.p99_ms:>6.1f}ms  {bare.rate:>13.0f} {bare.p50_ms:>5.1f}ms"
              f" {bare.p99_ms:>6.1f}ms  {tool.rate:>17.0f} {tool.p50_ms:>5.1f}ms {tool.p99_ms:>6.1f}ms"
              f"  {tool.rate / bare.rate:>5.2f}")  # fmt: skip
        if ref.errors or bare.errors or tool.errors:
            print(
                f"         errors: reference {ref.errors}, /health {bare.errors}, jobs_status {tool.errors}"
            )
    calm = [r for r in rows if r[2].p99_ms < 10]
    if calm:
        c, _, bare, tool = calm[-1]
        print(f"at {c} clients (the most with /health p99 under 10 ms): jobs_status p99 "
              f"{tool.p99_ms:.1f} ms, {tool.rate / bare.rate:.2f}x the bare endpoint's rate")  # fmt: skip
    bare_most, tool_most = max(r[2].rate for r in rows), max(r[3].rate for r in rows)
    print(f"capacity (the highest rate at any concurrency): /health {bare_most:.0f} req/s, jobs_status "
          f"{tool_most:.0f} req/s, {tool_most / bare_most:.2f}x")  # fmt: skip
    woke.sort()
    print(f"jobs_wait wake-up after the status write returned: p50 {woke[len(woke) // 2] * 1000:.1f} ms, "
          f"max {woke[-1] * 1000:.1f} ms (n={len(woke)})")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devstack", default="default", help="the running devstack cluster to use")
    parser.add_argument("--seconds", type=float, default=8.0, help="length of each timed run")
    parser.add_argument("--concurrency", default="1,4,16,64,128", help="comma-separated client counts")
    parser.add_argument("--wakeups", type=int, default=10)
    opts = parser.parse_args()
    levels = [int(c) for c in opts.concurrency.split(",")]
    state = devcluster.load_state(opts.devstack)
    if state is None:
        raise SystemExit(f"no devstack cluster {opts.devstack!r}: make cluster-up")
    hey_binary()
    namespace, token = bench_episode(state)
    work = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    (work / "token").write_text("unused")
    env = {
        "GATEWAY_NAMESPACE": namespace, "GATEWAY_ORCHESTRATOR_TOKEN": secrets.token_urlsafe(16),
        "GATEWAY_KUBECONFIG": str(state.kubeconfig), "GATEWAY_BROKER_TOKEN_FILE": str(work / "token"),
    }  # fmt: skip
    status_args = ["-m", "POST", "-T", "application/json", "-H", f"Authorization: Bearer {token}",
                   "-d", json.dumps(STATUS_CALL)]  # fmt: skip
    rows: list[tuple[int, Run, Run, Run]] = []
    try:
        with uvicorn(["--app-dir", str(REPO / "bench"), "hello_app:app"], devcluster.free_port(), {},
                     work / "reference.log") as reference:  # fmt: skip
            hey(reference, 4, 1)  # warm-up
            baseline = {c: hey(reference, c, opts.seconds) for c in levels}
        app = ["--factory", "env_gateway.main:app_from_env"]
        with uvicorn(app, devcluster.free_port(), env, work / "gateway.log") as url:
            hey(f"{url}/health", 4, 1)
            hey(f"{url}/mcp", 4, 1, *status_args)
            for c in levels:
                rows.append((c, baseline[c], hey(f"{url}/health", c, opts.seconds),
                             hey(f"{url}/mcp", c, opts.seconds, *status_args)))  # fmt: skip
            woke = asyncio.run(wakeups(state, namespace, url, token, opts.wakeups))
    finally:
        kubectl(state, "delete", "namespace", namespace, "--wait=false")
        shutil.rmtree(work, ignore_errors=True)
    report(rows, woke)


if __name__ == "__main__":
    main()
