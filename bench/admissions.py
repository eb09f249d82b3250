"""The admission side of the operator benchmarks: Episodes and AgentJobs made as the gateway makes
them, each timed from its create call to the first status a watch sees, beside a raw API round trip
timed the same way; and the process figures (CPU, resident memory) read from /proc."""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client, watch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator"), str(REPO / "launcher_image")]

from posttrain_operator.api.rules import new_job_metadata  # noqa: E402

GROUP, VERSION = "posttrain.dev", "v1alpha1"
BENCH_AGENT = "posttrain-bench"  # the bench's own requests, left out of the operator's counts


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def raw_round_trips(
    api: client.ApiClient, namespace: str, count: int, *, pace: float = 0.0, prefix: str = "probe"
) -> list[float]:
    """ConfigMap create+get, one after the other, `pace` seconds apart. Paced like the admission
    probes, the round trip is slower than back to back (an idle API server and client wake up for each
    one), so the ratio is taken against the paced figure: like against like."""
    core = client.CoreV1Api(api)
    times = []
    for i in range(count):
        started = time.perf_counter()
        await core.create_namespaced_config_map(
            namespace, {"metadata": {"name": f"{prefix}-{i}"}, "data": {"k": "v"}}
        )
        await core.read_namespaced_config_map(f"{prefix}-{i}", namespace)
        times.append(time.perf_counter() - started)
        await asyncio.sleep(pace)
    return times


async def create_episode(custom: client.CustomObjectsApi, namespace: str, name: str, jobs: int) -> None:
    """An Episode that can hold `jobs` hour-long jobs at once."""
    await custom.create_namespaced_custom_object(
        GROUP, VERSION, namespace, "episodes",
        {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": name},
         "spec": {"task": "t0_artifact", "budgetUSD": "1.00", "backend": "hf-jobs",
                  "limits": {"maxConcurrentJobs": jobs, "maxWallSeconds": 7200,
                             "maxJobTimeoutSeconds": 3600}}},
    )  # fmt: skip


def job_body(name: str, episode: dict[str, Any], *, bare: bool = False) -> dict[str, Any]:
    """An hour-long AgentJob of `episode` (its body), made as the gateway makes one (owned by its
    Episode and holding the operator's finalizer from the start), or `bare`, as a kubectl user might."""
    metadata = {"name": name} if bare else new_job_metadata(name, episode)
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": metadata,
            "spec": {"episode": episode["metadata"]["name"], "purpose": "train", "script": "print(1)",
                     "flavor": "cpu-basic", "timeoutSeconds": 3600}}  # fmt: skip


async def start_episodes(
    custom: client.CustomObjectsApi, namespace: str, numbers: range, jobs: int
) -> dict[str, dict[str, Any]]:
    """Create the Episodes and wait until every one has started (the bench measures admission, not
    episode start-up); returns them by name."""
    for e in numbers:
        await create_episode(custom, namespace, f"ep{e:03d}", jobs)
    while True:
        try:
            items = await list_all(custom, namespace, "episodes")
        except (aiohttp.ClientError, client.ApiException):  # cut short or timed out on a loaded machine
            continue
        if all(i.get("status", {}).get("phase") in ("Running", "Completed") for i in items):
            return {i["metadata"]["name"]: i for i in items}
        await asyncio.sleep(1)


async def list_all(custom: client.CustomObjectsApi, namespace: str, plural: str) -> list[dict[str, Any]]:
    """Every object, in pages of 500: one list of thousands can outlast the API server's timeout."""
    items: list[dict[str, Any]] = []
    token = ""
    while True:
        page = await custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, limit=500, _continue=token
        )
        items += page["items"]
        token = page["metadata"].get("continue") or ""
        if not token:
            return items


async def create_and_time_admissions(
    api: client.ApiClient,
    namespace: str,
    episodes: int,
    jobs: int,
    *,
    first: int = 0,
    concurrency: int = 16,
    pace: float = 0.0,
    bare: bool = False,
) -> tuple[list[float], int]:
    """Create `episodes` Episodes, then `jobs` AgentJobs in each (at most `concurrency` creates in
    flight, `pace` seconds apart), and time each from its create call to the first status a watch
    sees Admitted (or Running, or Rejected). One function on purpose (about 70 lines): the watch, the
    creates and the clock share the `created`/`admitted` maps, and the watch must be up before the
    first create so that no admission is missed."""
    custom = client.CustomObjectsApi(api)
    created: dict[str, float] = {}
    admitted: dict[str, float] = {}
    rejected = 0
    total = episodes * jobs
    done = asyncio.Event()

    def seen(obj: dict[str, Any]) -> None:
        nonlocal rejected
        name, phase = obj["metadata"]["name"], obj.get("status", {}).get("phase")
        if name in created and name not in admitted and phase in ("Admitted", "Running", "Rejected"):
            admitted[name] = time.perf_counter()
            rejected += phase == "Rejected"
        if len(admitted) == total:
            done.set()

    async def watch_jobs() -> None:
        """Watch, and after any break (a 410, a dropped stream) re-list and watch on from there."""
        while not done.is_set():
            w = watch.Watch()
            try:
                listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs")
                for obj in listed["items"]:
                    seen(obj)
                async with w.stream(
                    custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentjobs",
                    resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=300,
                ) as stream:  # fmt: skip
                    async for event in stream:
                        seen(event["object"])
                        if done.is_set():
                            return
            except Exception as exc:  # a failed list or a broken watch is retried, never fatal
                print(f"(watch restarted after {type(exc).__name__}: {exc!s:.200})", file=sys.stderr)
                await asyncio.sleep(1)

    watcher = asyncio.create_task(watch_jobs())
    await asyncio.sleep(0.5)
    numbers = range(first, first + episodes)
    started = await start_episodes(custom, namespace, numbers, jobs)
    gate = asyncio.Semaphore(concurrency)

    async def create(e: int, j: int) -> None:
        name = f"ep{e:03d}-j{j}"
        body = job_body(name, started[f"ep{e:03d}"], bare=bare)
        async with gate:
            created[name] = time.perf_counter()
            await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", body)
            await asyncio.sleep(pace)

    await asyncio.gather(*(create(e, j) for e in numbers for j in range(jobs)))
    finished = asyncio.create_task(done.wait())
    await asyncio.wait({finished, watcher}, timeout=1800, return_when=asyncio.FIRST_COMPLETED)
    watcher.cancel()
    if not done.is_set():
        raise RuntimeError(f"only {len(admitted)} of {total} jobs were seen admitted")
    return [admitted[n] - created[n] for n in created], rejected


async def wait_all_running(api: client.ApiClient, namespace: str, total: int) -> None:
    custom = client.CustomObjectsApi(api)
    while True:
        items = (await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs"))["items"]
        phases = [i.get("status", {}).get("phase") for i in items]
        refused = [
            i["status"].get("message") for i in items if i.get("status", {}).get("phase") == "Rejected"
        ]
        if refused:
            raise RuntimeError(f"{len(refused)} jobs were rejected, e.g.: {refused[0]}")
        if phases.count("Running") >= total:
            return
        await asyncio.sleep(max(2.0, total / 1000))  # a list of 10,000 jobs is tens of MB


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def reach(
    custom: client.CustomObjectsApi, namespace: str, plural: str, name: str, phase: str
) -> dict[str, Any]:
    """Poll (the bench's own requests do not count) until the object has `phase`; returns it."""
    while True:
        obj: dict[str, Any] = await custom.get_namespaced_custom_object(
            GROUP, VERSION, namespace, plural, name
        )
        if obj.get("status", {}).get("phase") == phase:
            return obj
        await asyncio.sleep(0.05)
