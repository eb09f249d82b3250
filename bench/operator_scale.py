"""Operator scale: admission latency and backend polling cost with many active jobs.

    python bench/operator_scale.py [--devstack NAME] [--episodes 200] [--jobs 5] [--window 60] [--quota-usd N]

Against the devstack control plane and the HF Jobs emulator (jobs 'run' for an hour without a
process, so they all stay active), with the operator as a real `kopf run` process:

- admission latency, AgentJob create -> `Admitted` seen on a watch: p50 / p99, beside a raw API
  create+get round trip measured in the same run, back to back and at the admissions' own pace (the
  ratio, against the paced one, says what the operator adds);
- backend (HF API) requests per minute with few and with all jobs active, and their ratio (the goal
  is flat: one list call per poll whatever the number of jobs);
- the operator's resident memory with every job active;
- Kubernetes API calls per admission, read from the API server's audit log: every request the
  operator (its reconcilers and kopf) makes about a new job and its Episode, from the job's creation
  until it is Running, for jobs created one at a time.

With `--quota-usd`, the namespace has a BudgetQuota, so every admission also reserves on it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "operator"), str(REPO / "launcher_image")]

from posttrain_operator.api.rules import new_job_metadata  # noqa: E402

from devstack.controlplane import cluster as devcluster  # noqa: E402
from devstack.hf_emulator import routes  # noqa: E402
from devstack.hf_emulator.repos import remove_tree  # noqa: E402
from tests.integration.support import (  # noqa: E402
    OperatorProcess,
    make_emulator,
    register_placeholder_repos,
)

GROUP, VERSION = "posttrain.dev", "v1alpha1"
PAGE = 50  # the emulator's list page size
BENCH_AGENT = "posttrain-bench"  # the bench's own requests, left out of the operator's counts
NOT_OPERATOR = (BENCH_AGENT, "kube-", "kubectl/")  # the control plane's own, and kubectl's
PROBE_PACE = 0.2  # seconds between the timed admissions of new jobs (5/s)


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
        listed = await custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "episodes")
        if all(i.get("status", {}).get("phase") in ("Running", "Completed") for i in listed["items"]):
            return {i["metadata"]["name"]: i for i in listed["items"]}
        await asyncio.sleep(1)


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
        await asyncio.sleep(2)


def cpu_seconds(pid: int) -> float:
    """User and system CPU time the process has used so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def requests_per_minute(emulator: Any, window: float) -> float:
    emulator.reset_stats()
    time.sleep(window)
    return sum(emulator.request_counts().values()) * 60 / window


class Stack:
    """The cluster (attached or started), an emulator, a namespace and an operator process."""

    def __init__(self, devstack: str | None, quota_usd: str | None) -> None:
        self.devstack = devstack
        self.quota_usd = quota_usd

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
            self.state, self.emulator, log_dir, self.namespace, POSTTRAIN_POLL_INTERVAL_SECONDS="10"
        ).start()
        self.operator.wait_ready()
        return self

    async def stop(self) -> None:
        self.operator.stop()
        self.emulator.stop()
        remove_tree(self.data_dir)
        await client.CoreV1Api(self.api).delete_namespace(self.namespace)
        await self.api.close()
        if self.owned:
            devcluster.down("bench")


async def polling_cost(stack: Stack, episodes: int, jobs: int, window: float, first: int = 0) -> float:
    """Requests per minute to the HF API once `episodes x jobs` more jobs are active."""
    await create_and_time_admissions(stack.api, stack.namespace, episodes, jobs, first=first)
    await wait_all_running(stack.api, stack.namespace, (first + episodes) * jobs)
    return requests_per_minute(stack.emulator, window)


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


async def admit_one_at_a_time(api: client.ApiClient, namespace: str, episodes: int, jobs: int) -> list[Any]:
    """Create jobs one at a time, each once the previous one is Running and the operator is quiet;
    returns (job, episode, created, running) windows for `calls_per_admission`."""
    custom = client.CustomObjectsApi(api)
    for e in range(episodes):
        await create_episode(custom, namespace, f"calls{e}", jobs)
    started = [await reach(custom, namespace, "episodes", f"calls{e}", "Running") for e in range(episodes)]
    await asyncio.sleep(2)  # the episodes' own start-up calls are over
    windows = []
    for e, episode in enumerate(started):
        for j in range(jobs):
            name = f"calls{e}-j{j}"
            body = job_body(name, episode)
            created = datetime.now(UTC)
            await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", body)
            await reach(custom, namespace, "agentjobs", name, "Running")
            running = datetime.now(UTC)
            await asyncio.sleep(1.0)  # kopf's own bookkeeping after the handler, and the events
            windows.append((name, f"calls{e}", created, running))
    return windows


@dataclass
class Admissions:
    """What the audit log says about jobs admitted one at a time."""

    per_job: float  # requests the operator made per admission
    by_call: Counter[str]  # the total by agent, verb and resource
    milestones: dict[str, list[float]]  # seconds from the create to each step, per job


def calls_per_admission(audit_log: Path, namespace: str, windows: list[Any]) -> Admissions:
    """Requests the operator made about each job (and its Episode, and Events) while it was admitted:
    from its creation to one second after it was seen Running. Status writes to the job after it was
    Running are the poller's and are left out. Also when, after the create, kopf made its first patch
    (its finalizer on a bare job; its progress after the handler on one born with it), the reconciler
    made its first call, and the job's first status write (Admitted) arrived."""
    entries = []
    # The API server rotates its audit log (audit-<time>.log beside it): read the rotated ones too.
    for path in sorted(audit_log.parent.glob("audit*.log")):
        with path.open() as log:
            for line in log:
                entry = json.loads(line)
                ref, agent = entry.get("objectRef") or {}, entry.get("userAgent", "")
                if ref.get("namespace") == namespace and not agent.startswith(NOT_OPERATOR):
                    entries.append(entry)
    by_call: Counter[str] = Counter()
    milestones: dict[str, list[float]] = {"kopf's first patch": [], "reconciler": [], "Admitted": []}
    for job, episode, created, running in windows:
        seen: dict[str, float] = {}
        for entry in entries:
            ref = entry["objectRef"]
            at = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if not created <= at <= running + timedelta(seconds=1):
                continue
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            named = ref.get("name")
            ours = (
                (ref.get("resource") == "agentjobs" and named == job)
                or (ref.get("resource") == "episodes" and named == episode)
                or ref.get("resource") == "events"
                or ref.get("resource") == "budgetquotas"  # read (or not found) and reserved on
            )
            if not ours or (resource == "agentjobs/status" and at > running):
                continue
            agent = "kopf" if entry["userAgent"].startswith("kopf/") else "operator"
            by_call[f"{agent} {entry['verb']} {resource}"] += 1
            after = (at - created).total_seconds()
            step = {"kopf": "kopf's first patch", "operator": "reconciler"}[agent]
            seen[step] = min(seen.get(step, after), after)
            if agent == "operator" and resource == "agentjobs/status":
                seen["Admitted"] = min(seen.get("Admitted", after), after)
        for step, after in seen.items():
            milestones[step].append(after)
    return Admissions(sum(by_call.values()) / len(windows), by_call, milestones)


def list_requests(emulator: Any) -> tuple[int, int]:
    """(logical list calls, HTTP pages) the emulator served: a follow-up page carries a cursor."""
    lists = [r for r in emulator.requests() if r.route == routes.LIST_JOBS]
    return sum("cursor=" not in r.path for r in lists), len(lists)


async def run(args: argparse.Namespace) -> None:
    stack = await Stack(args.devstack, args.quota_usd).start()
    try:
        raw = await raw_round_trips(stack.api, stack.namespace, 50)
        few_rpm = await polling_cost(stack, 2, 5, args.window)
        few_lists = list_requests(stack.emulator)
        started = time.perf_counter()
        burst, rejected = await create_and_time_admissions(
            stack.api, stack.namespace, args.episodes - 2, args.jobs, first=2
        )
        burst_seconds = time.perf_counter() - started
        active = args.episodes * args.jobs
        await wait_all_running(stack.api, stack.namespace, active)
        pid = stack.operator.proc.pid if stack.operator.proc else 0
        cpu_before = cpu_seconds(pid)
        many_rpm = requests_per_minute(stack.emulator, args.window)
        idle_cpu = (cpu_seconds(pid) - cpu_before) / args.window
        many_lists = list_requests(stack.emulator)
        # New jobs arriving at 5/s while every earlier job is still active: the admission latency a
        # user sees on a busy operator.
        paced_raw = await raw_round_trips(stack.api, stack.namespace, 50, pace=PROBE_PACE, prefix="paced")
        probes, _ = await create_and_time_admissions(
            stack.api, stack.namespace, 10, 5, first=args.episodes, concurrency=1, pace=PROBE_PACE
        )
        bare_probes, _ = await create_and_time_admissions(
            stack.api,
            stack.namespace,
            10,
            5,
            first=args.episodes + 10,
            concurrency=1,
            pace=PROBE_PACE,
            bare=True,
        )
        rss = rss_mib(stack.operator.proc.pid) if stack.operator.proc else float("nan")
        windows = await admit_one_at_a_time(stack.api, stack.namespace, 4, 5)
        admissions = calls_per_admission(stack.state.audit_log, stack.namespace, windows)
    finally:
        await stack.stop()
    raw_p50, paced_p50 = statistics.median(raw), statistics.median(paced_raw)
    p50, p99 = statistics.median(probes), percentile(probes, 0.99)
    lines = [
        f"episodes x jobs     {args.episodes} x {args.jobs} = {active} active jobs ({rejected} rejected)",
        f"raw API create+get  p50 {raw_p50 * 1000:8.1f} ms   p99 {percentile(raw, 0.99) * 1000:8.1f} ms"
        "   (back to back)",
        f"raw API create+get  p50 {paced_p50 * 1000:8.1f} ms   p99 {percentile(paced_raw, 0.99) * 1000:8.1f}"
        f" ms   ({1 / PROBE_PACE:.0f}/s, as the admissions below)",
        f"admission           p50 {p50 * 1000:8.1f} ms   p99 {p99 * 1000:8.1f} ms   (50 new jobs at 5/s, "
        "made as the gateway makes them)",
        f"admission, bare     p50 {statistics.median(bare_probes) * 1000:8.1f} ms   "
        f"p99 {percentile(bare_probes, 0.99) * 1000:8.1f} ms   (50 more, with no owner or finalizer yet)",
        f"admission / raw     {p50 / paced_p50:8.1f}x (p50, against the raw round trip at 5/s; "
        f"{p50 / raw_p50:.1f}x against back to back)",
        f"burst               {len(burst)} jobs created at once, all admitted in {burst_seconds:.0f} s "
        f"(p50 {statistics.median(burst):.1f} s, p99 {percentile(burst, 0.99):.1f} s: queueing)",
        f"HF API requests/min {few_rpm:8.1f} with 10 active jobs, {many_rpm:8.1f} with {active}",
        f"list calls (pages)  {few_lists[0]} ({few_lists[1]}) with 10, "
        f"{many_lists[0]} ({many_lists[1]}) with {active}",
        f"polling cost ratio  {many_rpm / few_rpm:8.2f} for {active // 10}x the jobs (pages of {PAGE})",
        f"operator RSS        {rss:8.1f} MiB",
        f"operator CPU        {idle_cpu * 100:8.1f}% of a core with {active} jobs active and nothing to do",
        f"API calls/admission {admissions.per_job:8.1f} (mean of {len(windows)} jobs created one at a time)",
        *(f"    {count / len(windows):5.1f}  {call}" for call, count in sorted(admissions.by_call.items())),
        "after the create, p50 (same jobs): "
        + ", ".join(
            f"{step} {statistics.median(t) * 1000:.1f} ms" for step, t in admissions.milestones.items() if t
        ),
    ]
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devstack", help="attach to this running devstack cluster instead of starting one")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=5, help="jobs per episode")
    parser.add_argument("--window", type=float, default=60.0, help="seconds over which requests are counted")
    parser.add_argument("--quota-usd", help="give the namespace a BudgetQuota of this many dollars a month")
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
