"""Operator scale: admission latency, backend polling cost and drain time with many active jobs.

    python bench/operator_scale.py [--devstack NAME] [--sweep 1000,3000,10000] [--jobs 5] [--window 60]
                                   [--quota-usd N] [--drain full|backend|none]
                                   [--operator-env POSTTRAIN_X=VALUE ...]

Against the devstack control plane and the HF Jobs emulator (jobs 'run' for an hour without a
process, so they all stay active), with the operator as a real `kopf run` process. The active jobs
grow through each size of the sweep (`--jobs` per Episode); at each size:

- the burst: the jobs that reach the size, created at once, until all are admitted;
- admission latency of 50 new jobs at 5/s, AgentJob create -> `Admitted` seen on a watch, p50 / p99,
  beside a raw API create+get round trip timed at the same pace in the same run (the ratio says
  what the operator adds), and 50 more created bare (no owner or finalizer yet);
- backend (HF API) requests per minute, counted by the emulator over a window at least three status
  passes long, and the list calls and pages behind them;
- the operator's CPU (with every job active and nothing to do) and resident memory;
- the garbage collector's pauses (the operator's `posttrain_gc_*` metrics), in the burst and after it.

Then Kubernetes API calls per admission (`audit_calls.py`), and the drain: every Episode deleted at
once, until every job is cancelled on the backend (`--drain backend` stops there: the rest is the API
server's garbage collector, about 9 deletions a second), settled, and gone.

Each size also prints the machine's load average, since the figures depend on what runs beside.

With `--quota-usd`, the namespace has a BudgetQuota, so every admission also reserves on it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from admissions import (
    BENCH_AGENT,
    GROUP,
    REPO,
    VERSION,
    cpu_seconds,
    create_and_time_admissions,
    list_all,
    percentile,
    raw_round_trips,
    rss_mib,
    wait_all_running,
)
from audit_calls import admit_one_at_a_time, calls_per_admission
from kubernetes_asyncio import client, config
from prometheus_client.parser import text_string_to_metric_families

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import routes
from devstack.hf_emulator.repos import remove_tree
from tests.integration.support import OperatorProcess, make_emulator, register_placeholder_repos

PAGE = 50  # the emulator's list page size
PROBE_PACE = 0.2  # seconds between the timed admissions of new jobs (5/s)
PROBE_EPISODES = 10  # 10 Episodes x 5 jobs: 50 probes, twice per size
POLL_REQUESTS_PER_MINUTE = 120.0  # the operator's default budget for its status passes
ACTIVE = {"stage": ["RUNNING", "SCHEDULING"]}


class Stack:
    """The cluster (attached or started), an emulator, a namespace and an operator process."""

    def __init__(self, devstack: str | None, quota_usd: str | None, operator_env: dict[str, str]) -> None:
        self.devstack = devstack
        self.quota_usd = quota_usd
        self.operator_env = operator_env

    async def start(self) -> Stack:
        attached = devcluster.load_state(self.devstack) if self.devstack else None
        self.owned = attached is None
        self.state = attached or devcluster.up("bench")
        await asyncio.to_thread(
            subprocess.run,
            [str(self.state.kubectl()), f"--kubeconfig={self.state.kubeconfig}", "apply", "--server-side",
             "--force-conflicts", "-f", str(REPO / "crds")],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip
        self.namespace = f"bench-{uuid.uuid4().hex[:6]}"
        self.emulator, self.data_dir = make_emulator(execute=False, simulated_runtime=3600.0, page_size=PAGE)
        register_placeholder_repos(self.emulator, Path(tempfile.mkdtemp()) / "repos")
        await config.load_kube_config(str(self.state.kubeconfig))
        self.api = client.ApiClient()
        self.api.user_agent = BENCH_AGENT
        await client.CoreV1Api(self.api).create_namespace({"metadata": {"name": self.namespace}})
        if self.quota_usd is not None:  # every admission then reserves on the quota too
            meta, spec = {"name": "default"}, {"limitUSD": self.quota_usd}
            quota = {
                "apiVersion": f"{GROUP}/{VERSION}",
                "kind": "BudgetQuota",
                "metadata": meta,
                "spec": spec,
            }
            await client.CustomObjectsApi(self.api).create_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "budgetquotas", quota
            )
        log_dir = Path(tempfile.mkdtemp(prefix="bench-operator-"))
        self.operator = OperatorProcess(
            self.state, self.emulator, log_dir, self.namespace,
            **{"POSTTRAIN_POLL_INTERVAL_SECONDS": "10", **self.operator_env},
        ).start()  # fmt: skip
        self.operator.wait_ready()
        self.active = 0  # jobs running now
        self.episodes = 0  # Episodes made so far
        return self

    async def stop(self) -> None:
        self.operator.stop()
        self.emulator.stop()
        remove_tree(self.data_dir)
        await client.CoreV1Api(self.api).delete_namespace(self.namespace)
        await self.api.close()
        if self.owned:
            devcluster.down("bench")


@dataclass
class Step:
    """The figures at one size of the sweep."""

    active: int
    burst: list[float]
    burst_seconds: float
    rejected: int
    raw_paced: list[float]
    probes: list[float]
    bare_probes: list[float]
    hf_per_minute: float
    window: float
    lists: tuple[int, int]
    idle_cpu: float
    rss: float
    load: tuple[float, float, float]
    collector: tuple[Pauses, Pauses, Pauses]  # before the burst, after it, after the probes

    def lines(self) -> list[str]:
        raw_p50, p50 = statistics.median(self.raw_paced), statistics.median(self.probes)
        pages = f"{self.lists[0]} list calls, {self.lists[1]} pages of {PAGE}"
        return [
            f"-- {self.active} active jobs",
            f"burst               {len(self.burst)} jobs created at once ({self.rejected} rejected), all "
            f"admitted in {self.burst_seconds:.0f} s (p50 {statistics.median(self.burst):.1f} s, "
            f"p99 {percentile(self.burst, 0.99):.1f} s: queueing)",
            f"raw API create+get  {spread(self.raw_paced)}   (at 5/s, as the admissions below)",
            f"admission           {spread(self.probes)}   (50 new jobs at 5/s, as the gateway makes them)",
            f"admission, bare     {spread(self.bare_probes)}   (50 more, with no owner or finalizer yet)",
            f"admission / raw     {p50 / raw_p50:8.1f}x (p50)",
            f"HF API requests/min {self.hf_per_minute:8.1f} over {self.window:.0f} s: {pages}",
            f"operator CPU        {self.idle_cpu * 100:8.1f}% of a core, every job active and nothing to do",
            f"operator RSS        {self.rss:8.1f} MiB",
            f"collector, burst    {pauses_between(self.collector[0], self.collector[1])}",
            f"collector, at rest  {pauses_between(self.collector[1], self.collector[2])} (idle and probes)",
            "machine load        " + " ".join(f"{x:.1f}" for x in self.load) + " (1, 5, 15 min averages)",
        ]


Pauses = dict[str, dict[str, float]]  # metric -> generation -> value


async def collector_pauses(metrics_url: str) -> Pauses:
    """The operator's `posttrain_gc_*` figures, from its metrics endpoint."""
    async with aiohttp.ClientSession() as session, session.get(f"{metrics_url}/metrics") as response:
        text = await response.text()
    pauses: Pauses = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("posttrain_gc_"):
                pauses.setdefault(sample.name, {})[sample.labels["generation"]] = sample.value
    return pauses


def pauses_between(before: Pauses, after: Pauses) -> str:
    count, seconds = "posttrain_gc_collections_total", "posttrain_gc_pause_seconds_total"
    parts = [
        f"{after[count][g] - before[count][g]:.0f} {name} ({after[seconds][g] - before[seconds][g]:.1f} s)"
        for g, name in (("2", "full"), ("1", "middle"), ("0", "young"))
    ]
    longest = max(after["posttrain_gc_longest_pause_seconds"].values())
    return ", ".join(parts) + f"; longest so far {longest:.2f} s"


def spread(seconds: list[float]) -> str:
    return f"p50 {statistics.median(seconds) * 1000:8.1f} ms   p99 {percentile(seconds, 0.99) * 1000:8.1f} ms"


def pass_window(active: int, floor: float) -> float:
    """A window at least three status passes long: with many jobs a pass costs a request a page
    and the operator spaces passes to stay within its request budget."""
    pages = math.ceil(active / PAGE) + 1
    return max(floor, 3 * max(10.0, pages * 60 / POLL_REQUESTS_PER_MINUTE))


async def requests_per_minute(emulator: Any, window: float) -> tuple[float, tuple[int, int]]:
    emulator.reset_stats()
    await asyncio.sleep(window)
    lists = [r for r in emulator.requests() if r.route == routes.LIST_JOBS]
    pages = (sum("cursor=" not in r.path for r in lists), len(lists))  # a follow-up page has a cursor
    return sum(emulator.request_counts().values()) * 60 / window, pages


async def admit(stack: Stack, episodes: int, jobs: int, **pacing: Any) -> tuple[list[float], int]:
    """New Episodes of `jobs` jobs each, numbered on from the last; their admission times."""
    first, stack.episodes = stack.episodes, stack.episodes + episodes
    return await create_and_time_admissions(stack.api, stack.namespace, episodes, jobs, first=first, **pacing)


async def grow_to(stack: Stack, size: int, jobs: int, window: float) -> Step:
    """Add Episodes of `jobs` jobs until `size` jobs are active; measure."""
    episodes = max(1, math.ceil((size - stack.active) / jobs))
    before_burst = await collector_pauses(stack.operator.metrics_url)
    started = time.perf_counter()
    burst, rejected = await admit(stack, episodes, jobs)
    burst_seconds = time.perf_counter() - started
    stack.active += episodes * jobs - rejected
    await wait_all_running(stack.api, stack.namespace, stack.active)
    after_burst = await collector_pauses(stack.operator.metrics_url)
    pid = stack.operator.proc.pid if stack.operator.proc else 0
    cpu_before = cpu_seconds(pid)
    window = pass_window(stack.active, window)
    # A mark to profile the idle operator by (`py-spy record -d WINDOW` once it is printed).
    print(f"({stack.active} jobs running; idle for {window:.0f} s from {time.strftime('%T')})", flush=True)
    hf_per_minute, lists = await requests_per_minute(stack.emulator, window)
    idle_cpu = (cpu_seconds(pid) - cpu_before) / window
    paced_raw = await raw_round_trips(stack.api, stack.namespace, 50, pace=PROBE_PACE, prefix=f"paced{size}")
    measured_at = stack.active
    probes, _ = await admit(stack, PROBE_EPISODES, 5, concurrency=1, pace=PROBE_PACE)
    bare, _ = await admit(stack, PROBE_EPISODES, 5, concurrency=1, pace=PROBE_PACE, bare=True)
    stack.active += 2 * PROBE_EPISODES * 5
    rss = rss_mib(pid)
    collector = (before_burst, after_burst, await collector_pauses(stack.operator.metrics_url))
    return Step(measured_at, burst, burst_seconds, rejected, paced_raw, probes, bare, hf_per_minute, window,
                lists, idle_cpu, rss, os.getloadavg(), collector)  # fmt: skip


async def drain(stack: Stack, to_the_end: bool) -> tuple[float, float | None]:
    """Delete every Episode at once; seconds until the backend runs none of their jobs (the operator
    cancelled them all), and until every AgentJob and Episode is gone (settled, finalizers removed,
    and collected by the API server's garbage collector, which deletes at its own client rate)."""
    custom = client.CustomObjectsApi(stack.api)
    started = time.perf_counter()
    await delete_every_episode(custom, stack.namespace)
    cancelled = None
    while True:
        if cancelled is None and stack.emulator.count_jobs(stack.emulator.namespace, ACTIVE) == 0:
            cancelled = time.perf_counter() - started
            if not to_the_end:
                return cancelled, None
        left = 0
        for plural in ("episodes", "agentjobs"):
            one = await custom.list_namespaced_custom_object(GROUP, VERSION, stack.namespace, plural, limit=1)
            left += len(one["items"])
        if not left and cancelled is not None:
            return cancelled, time.perf_counter() - started
        await asyncio.sleep(1)


async def delete_every_episode(custom: client.CustomObjectsApi, namespace: str) -> None:
    """One delete-collection, again while any Episode is left undeleted: at 2,000 Episodes (each
    with a finalizer, so each an update in etcd) one call outlasts the API server's request timeout."""
    while True:
        with contextlib.suppress(aiohttp.ClientError, asyncio.TimeoutError, client.ApiException):
            await custom.delete_collection_namespaced_custom_object(GROUP, VERSION, namespace, "episodes")
        with contextlib.suppress(aiohttp.ClientError, client.ApiException):
            left = await list_all(custom, namespace, "episodes")
            if all(e["metadata"].get("deletionTimestamp") for e in left):
                return


async def run(args: argparse.Namespace) -> None:
    operator_env = dict(setting.split("=", 1) for setting in args.operator_env)
    stack = await Stack(args.devstack, args.quota_usd, operator_env).start()
    sizes = sorted(int(s) for s in args.sweep.split(","))
    try:
        raw = await raw_round_trips(stack.api, stack.namespace, 50)
        for size in sizes:
            step = await grow_to(stack, size, args.jobs, args.window)
            print("\n".join(step.lines()), flush=True)
        windows = await admit_one_at_a_time(stack.api, stack.namespace, 4, 5)
        admissions = calls_per_admission(stack.state.audit_log, stack.namespace, windows)
        drained = await drain(stack, args.drain == "full") if args.drain != "none" else None
    finally:
        await stack.stop()
    lines = [
        f"raw API create+get  {spread(raw)}   (back to back, before any job)",
        f"API calls/admission {admissions.per_job:8.1f} (mean of {len(windows)} jobs created one at a time)",
        *(f"    {count / len(windows):5.1f}  {call}" for call, count in sorted(admissions.by_call.items())),
        "after the create, p50 (same jobs): "
        + ", ".join(
            f"{step} {statistics.median(t) * 1000:.1f} ms" for step, t in admissions.milestones.items() if t
        ),
    ]
    if drained is not None:
        gone = f"{drained[1]:.1f} s until every job and Episode was gone" if drained[1] is not None else ""
        lines.append(
            f"drain               {drained[0]:8.1f} s until the backend ran none of {stack.active + 20} jobs "
            f"(every Episode deleted at once) {gone}"
        )
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devstack", help="attach to this running devstack cluster instead of starting one")
    parser.add_argument("--sweep", default="1000", help="active-job sizes to grow through: 1000,3000,10000")
    parser.add_argument("--jobs", type=int, default=5, help="jobs per episode")
    parser.add_argument("--window", type=float, default=60.0, help="least seconds to count requests over")
    parser.add_argument("--quota-usd", help="give the namespace a BudgetQuota of this many dollars a month")
    parser.add_argument(
        "--operator-env", action="append", default=[], metavar="POSTTRAIN_X=VALUE",
        help="a setting for the operator (repeatable): POSTTRAIN_EPISODE_TICK_SECONDS=5",
    )  # fmt: skip
    parser.add_argument(
        "--drain", choices=("full", "backend", "none"), default="full",
        help="after the sweep: delete every Episode; time it to the end, to the last job running, or not",
    )  # fmt: skip
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
