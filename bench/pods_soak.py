"""Chaos soak, pods backend on kind: a few hundred AgentJobs as pods while the cluster fails at seeded
moments.

    cd bench && ../.venv/bin/python pods_soak.py --seed 1 [--minutes 6] [--episodes 24] [--jobs 240]
        [--keep] [--reuse]

On a kind cluster of its own (`posttrain-soak`, one node), with the chart installed from the project's
images and the pods backend enabled (the e2e layer's values, HF Jobs off). AgentJobs arrive at a
steady rate into Episodes that each hold a few jobs at a time and a small budget; each job sleeps a
few seconds. A quarter of them ask for the `soak-big` flavor, whose memory request is 40% of what
the node can allocate, and every job asks for a tenth of a core: the node runs only a few at a time
and the others stay Pending for capacity until earlier ones finish. A timeline drawn from the seed:

- kills the operator: SIGKILL to its container (the kubelet restarts it) or a forced delete of its
  pod (the Deployment makes another, which takes over the leader Lease);
- restarts the kubelet (`systemctl restart kubelet` in the node);
- restarts the kube-apiserver (SIGKILL to its static pod's container; the kubelet starts it again);
- ends Episodes early with jobs running: deleted, or submitted (a grader job then runs); the others
  end at their wall-clock limit.

A watch on every job pod (all namespaces, by the backend's managed-by label) records what each pod
did: when its container started, whether it ended on its own or was deleted while it ran, and when.
Then the soak waits until everything has settled and checks from outside: every AgentJob terminal;
no job pod created twice for one AgentJob (one pod UID per idempotency key, one key per job); no job
pod left Pending or Running; `reserved + settled <= budget` on every Episode version a watch
delivered; for every ended Episode, settled plus platform spend equal to what its pods ran, at the
flavors' prices (the pods backend's bill: the job container's start to its end, per started minute;
for a pod the operator deleted while it ran, its delete request ends the bill, so the books must lie
between the start-to-request and start-to-container-end costs); no orphan without a reason. It
prints its seed, the faults it made and the figures, prints the jobs and pods behind every
violation, exits non-zero on any, and deletes its cluster (also on failure) unless `--keep`. With
`--reuse` it soaks on the cluster a `--keep` run left (its Episodes and pods told apart by the seed
in their names), which saves the cluster's creation and the images' load between seeds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import yaml
from admissions import BENCH_AGENT, GROUP, REPO, VERSION
from kubernetes_asyncio import client, config, watch
from posttrain_operator.api.rules import new_job_metadata, parse_time
from posttrain_operator.backends.pods import names
from posttrain_operator.backends.pods.status import remote_status
from posttrain_operator.ledger import billed_seconds, cost_for
from soak_checks import UNREACHABLE, EpisodeBooks, job_seen, still_open, untyped_orphans
from soak_faults import Timeline

from devstack.hf_emulator.repos import remove_tree
from devstack.kind import cluster as kind
from devstack.kind import images
from devstack.toolchain.build import ensure_binaries
from graders.assets import build_repos, default_assets_dir, task_builders
from tests.e2e.support import STORE_IN_NODE, Cluster, e2e_values, stage_store

CLUSTER = "posttrain-soak"  # never posttrain-e2e: CI's
NODE = f"{CLUSTER}-control-plane"
RELEASE, NAMESPACE = "soak", "posttrain-soak"
CHART = REPO / "helm" / "posttrain-operator"
TASK = "t0_artifact"  # its jobs mount only small datasets; its grader scores what a job left
TERMINAL_PODS = {"Succeeded", "Failed"}
# The operator reads its clock, then reads the pod, then asks for its deletion: how far before the
# delete request its recorded end of a cancelled job may lie.
CANCEL_SLACK = timedelta(seconds=15)
# containerd's filters for the containers the soak kills.
OPERATOR_CONTAINER = (
    f'labels."io.kubernetes.container.name"==operator,labels."io.kubernetes.pod.namespace"=={NAMESPACE}'
)
APISERVER_CONTAINER = 'labels."io.kubernetes.container.name"==kube-apiserver'
UNSEEN = 10**12  # the high end of the bill of a pod whose end the watch missed


def flavors(node_memory_mib: int) -> dict[str, dict[str, Any]]:
    """The soak's flavors: small ones, and `soak-big`, of which two fit the node at a time."""
    small = {"cpu": "1", "cpuRequest": "100m", "memory": "512Mi", "shmSize": "64Mi"}
    return {
        "cpu-basic": {**small, "priceMicroUSDPerMinute": 167},
        "cpu-upgrade": {**small, "priceMicroUSDPerMinute": 500},  # the task's grader flavor
        "soak-big": {**small, "memory": f"{int(node_memory_mib * 0.4)}Mi", "priceMicroUSDPerMinute": 334},
    }


# -- the cluster ------------------------------------------------------------------------------------


@dataclass
class Stack:
    workdir: Path
    cluster: Cluster
    flavors: dict[str, dict[str, Any]] = field(default_factory=dict)
    allocatable: dict[str, str] = field(default_factory=dict)

    def node(self, *command: str, check: bool = True) -> str:
        proc = subprocess.run(["docker", "exec", NODE, *command], capture_output=True, text=True, timeout=120)
        if check and proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} in {NODE}: {proc.stderr.strip()[:400]}")
        return proc.stdout


WORKDIR = Path(tempfile.gettempdir(), CLUSTER)  # the store, the kubeconfig, what a kept cluster was given


def kept() -> Stack | None:
    """The cluster a run with --keep left, if it is still there."""
    saved = WORKDIR / "stack.json"
    if not (saved.exists() and kind.exists(CLUSTER)):
        return None
    found = json.loads(saved.read_text())
    cluster = Cluster(
        WORKDIR / "kubeconfig", is_kind=True, bin_dir=ensure_binaries(), store_dir=WORKDIR / "store"
    )
    return Stack(WORKDIR, cluster, found["flavors"], found["allocatable"])


def bring_up(reuse: bool) -> Stack:
    """The cluster with the project's images, the store staged, the chart installed (--wait); with
    `reuse`, on the cluster a kept run left if there is one (images and repos already there are not
    loaded again, the chart is upgraded)."""
    bin_dir = ensure_binaries()
    workdir = WORKDIR
    store, kubeconfig = workdir / "store", workdir / "kubeconfig"
    if not (reuse and kubeconfig.exists() and kind.exists(CLUSTER)):
        remove_tree(workdir)
        workdir.mkdir(mode=0o711)
        store.mkdir(mode=0o755)
        kind.create(CLUSTER, kubeconfig, mounts={str(store): STORE_IN_NODE})
    stack = Stack(workdir, Cluster(kubeconfig, is_kind=True, bin_dir=bin_dir, store_dir=store))
    base = images.choose_base()
    operator_image, launcher_image = images.build(images.OPERATOR, base), images.build(images.LAUNCHER, base)
    kind.load_images(CLUSTER, [operator_image, launcher_image])
    # Only the repos of the soak's task: building every task's (a base model's pre-training among
    # them) takes many minutes on a busy machine.
    stage_store(store, build_repos(task_builders(TASK), default_assets_dir(), print))
    cluster = stack.cluster
    node = cluster.json("get", "nodes")["items"][0]
    stack.allocatable = node["status"]["allocatable"]
    memory_mib = int(stack.allocatable["memory"].removesuffix("Ki")) // 1024
    stack.flavors = flavors(memory_mib)
    if not cluster.kubectl("get", "namespace", NAMESPACE, "--ignore-not-found").strip():
        cluster.kubectl("create", "namespace", NAMESPACE)
        token = secrets.token_urlsafe(24)
        cluster.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "orchestrator", f"--from-literal=token={token}"
        )  # fmt: skip
    values = e2e_values(operator_image, "http://127.0.0.1:9", "Never", launcher_image)
    values["hfJobs"] = {"enabled": False}
    values["gateway"]["defaultBackend"] = "pods"
    values["pods"]["flavors"] = stack.flavors
    path = workdir / "values.yaml"
    path.write_text(yaml.safe_dump(values))
    proc = cluster.helm(
        "upgrade", "--install", RELEASE, str(CHART), "--namespace", NAMESPACE, "--values", str(path),
        "--wait", "--timeout", "8m",
    )  # fmt: skip
    if proc.returncode != 0:
        pods = cluster.kubectl("-n", NAMESPACE, "get", "pods", "-o", "wide", check=False)
        raise RuntimeError(f"helm install failed: {proc.stderr}\n{pods}")
    # The operator lists its tasks in the chart's task policy once it is up; until the API server
    # applies it, every Episode is refused.
    probe = json.dumps({
        "apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": "policy-probe"},
        "spec": {"task": TASK, "budgetUSD": "0.05", "backend": "pods"},
    })  # fmt: skip
    for _ in range(120):
        dry = cluster.run("kubectl", "-n", NAMESPACE, "create", "--dry-run=server", "-f", "-", input=probe)
        if dry.returncode == 0:
            break
        time.sleep(1)
    else:
        raise RuntimeError(f"the task policy never admitted {TASK}: {dry.stderr}")
    (workdir / "stack.json").write_text(
        json.dumps({"flavors": stack.flavors, "allocatable": stack.allocatable})
    )
    return stack


def tear_down(stack: Stack | None, keep: bool) -> None:
    if keep:
        where = f", KUBECONFIG={stack.cluster.kubeconfig}" if stack else ""
        print(f"kept: kind cluster {CLUSTER}{where}", file=sys.stderr)
        return
    kind.delete(CLUSTER)
    if stack is not None:
        remove_tree(stack.workdir)


# -- what the pods did ------------------------------------------------------------------------------


@dataclass
class PodSeen:
    """One job pod (by UID) as the watch saw it."""

    namespace: str
    name: str
    key: str
    job: str
    episode: str  # "<namespace>/<episode>"
    started: datetime | None = None  # the job container's start
    ended: dict[str, Any] | None = None  # the first version in a terminal phase, not being deleted
    deleted_running: dict[str, Any] | None = None  # the first version being deleted before its end
    last: dict[str, Any] | None = None
    gone: bool = False
    unschedulable_since: float | None = None
    capacity_wait: float | None = None  # seconds Pending as Unschedulable, once scheduled


def container_end(pod: dict[str, Any] | None) -> datetime | None:
    return remote_status(pod).finished_at if pod else None


class PodWatch:
    def __init__(self, core: client.CoreV1Api, to_dict: Any, episodes: str) -> None:
        self.core = core
        self.episodes = episodes  # the prefix of the Episode annotation of the pods it records
        self.to_dict = to_dict
        self.pods: dict[str, PodSeen] = {}
        self.relists = 0
        self.missed = 0  # pods gone during a re-list gap: their end unseen

    def observe(self, pod: dict[str, Any], deleted: bool = False) -> None:
        meta = pod["metadata"]
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        if not annotations.get(names.EPISODE_ANNOTATION, "").startswith(self.episodes):
            return
        key, job = annotations.get(names.KEY_ANNOTATION, ""), labels.get(names.JOB_LABEL, "")
        episode = annotations.get(names.EPISODE_ANNOTATION, "")
        seen = self.pods.setdefault(meta["uid"], PodSeen(meta["namespace"], meta["name"], key, job, episode))
        status = pod.get("status") or {}
        phase = status.get("phase")
        remote = remote_status(pod)
        seen.started = seen.started or remote.started_at
        deleting = meta.get("deletionTimestamp") and phase not in TERMINAL_PODS
        if deleting and seen.ended is None and seen.deleted_running is None:
            seen.deleted_running = pod
        if phase in TERMINAL_PODS and seen.ended is None and seen.deleted_running is None:
            seen.ended = pod
        unschedulable = any(
            (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", "Unschedulable")
            for c in status.get("conditions") or []
        )
        if unschedulable and seen.unschedulable_since is None:
            seen.unschedulable_since = time.monotonic()
        waited = seen.unschedulable_since is not None and seen.capacity_wait is None
        if pod["spec"].get("nodeName") and waited and seen.unschedulable_since is not None:
            seen.capacity_wait = time.monotonic() - seen.unschedulable_since
        seen.last = pod
        seen.gone = seen.gone or deleted

    async def relist(self) -> str:
        listed = self.to_dict(await self.core.list_pod_for_all_namespaces(label_selector=names.MANAGED_LABEL))
        present = set()
        for pod in listed["items"]:
            self.observe(pod)
            present.add(pod["metadata"]["uid"])
        for uid, seen in self.pods.items():
            if uid not in present and not seen.gone:
                seen.gone = True
                if seen.ended is None and seen.deleted_running is None:
                    self.missed += 1
        self.relists += 1
        version: str = listed["metadata"]["resourceVersion"]
        return version

    async def run(self) -> None:
        """Every version of every job pod; resumed from the last version seen through API server
        restarts, re-listed only when the API server no longer has it (410)."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self.relist()
                async with watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, label_selector=names.MANAGED_LABEL,
                    resource_version=version, allow_watch_bookmarks=True, timeout_seconds=300,
                ) as stream:  # fmt: skip
                    async for event in stream:
                        raw = event["raw_object"]
                        if event["type"] == "ERROR":
                            version = None if raw.get("code") == 410 else version
                            break
                        version = raw["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.observe(raw, deleted=event["type"] == "DELETED")
            except asyncio.CancelledError:
                raise
            except client.ApiException as exc:
                if exc.status == 410:
                    version = None
                await asyncio.sleep(1)
            except Exception:
                await asyncio.sleep(1)


@dataclass(frozen=True)
class Bill:
    """What one pod ran, in micro-dollars: exact (`low == high`) or a range (a cancelled pod's)."""

    low: int
    high: int
    how: str
    full: int  # start to the container's real end, as far as the watch saw it


def bill_of(seen: PodSeen, price: int) -> Bill:
    def cost(end: datetime | None) -> int:
        return cost_for(price, billed_seconds(seen.started, end))

    if seen.started is None:
        return Bill(0, 0, "never started", 0)
    if seen.ended is not None:
        remote = remote_status(seen.ended)
        exact = cost_for(price, billed_seconds(remote.started_at, remote.finished_at))
        return Bill(exact, exact, "ran to its end", exact)
    if seen.deleted_running is not None:
        meta = seen.deleted_running["metadata"]
        deadline = parse_time(meta["deletionTimestamp"])
        assert deadline is not None
        request = deadline - timedelta(seconds=meta.get("deletionGracePeriodSeconds") or 0)
        end = container_end(seen.last) or deadline
        return Bill(cost(request - CANCEL_SLACK), cost(max(end, request)), "deleted while running", cost(end))
    return Bill(0, UNSEEN, "end unseen", 0)


# -- the soak ---------------------------------------------------------------------------------------


class Soak:
    def __init__(self, args: argparse.Namespace, stack: Stack) -> None:
        self.args = args
        self.stack = stack
        self.prefix = f"s{args.seed}-"  # this run's Episodes, apart from a kept cluster's earlier ones
        self.rng = random.Random(args.seed)
        self.timeline = Timeline.draw(self.rng, args.minutes * 60, kills=args.kills,
                                      apiserver_restarts=args.apiserver_restarts, faults=0,
                                      episodes=args.episodes,
                                      kubelet_restarts=args.kubelet_restarts)  # fmt: skip
        # The load and the timeline's actions draw from their own generators: which of them runs first
        # at a moment depends on the machine, and must not change what the other draws.
        self.load_rng, self.act_rng = random.Random(f"{args.seed}-load"), random.Random(f"{args.seed}-act")
        self.violations: list[str] = []
        self.soak_errors: list[str] = []  # the soak's own actions that failed: not the product's
        self.created = 0
        self.ended_by: Counter[str] = Counter()
        self.faults_made: Counter[str] = Counter()
        self.live: list[dict[str, Any]] = []

    async def start(self) -> None:
        await config.load_kube_config(str(self.stack.cluster.kubeconfig))
        self.api = client.ApiClient()
        self.api.user_agent = BENCH_AGENT
        self.custom = client.CustomObjectsApi(self.api)
        self.core = client.CoreV1Api(self.api)
        self.books = EpisodeBooks(self.custom, NAMESPACE, prefix=self.prefix)
        self.pods = PodWatch(self.core, self.api.sanitize_for_serialization, f"{NAMESPACE}/{self.prefix}")

    # -- the load --------------------------------------------------------------------------------

    async def make_episodes(self) -> None:
        for e in range(self.args.episodes):
            wall = int(self.rng.uniform(0.4, 1.3) * self.args.minutes * 60)
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode",
                    "metadata": {"name": f"{self.prefix}ep{e:03d}"},
                    "spec": {"task": TASK, "budgetUSD": self.args.budget, "backend": "pods",
                             "flavors": ["cpu-basic", "cpu-upgrade", "soak-big"],
                             "limits": {"maxConcurrentJobs": 3, "maxWallSeconds": wall,
                                        "maxJobTimeoutSeconds": 300}}}  # fmt: skip
            created = await self.books.create("episodes", body)
            if created is not None:
                self.live.append(created)

    async def load(self, seconds: float) -> None:
        gap = seconds / self.args.jobs
        pending: set[asyncio.Task[None]] = set()
        started = time.monotonic()
        for n in range(self.args.jobs):
            await asyncio.sleep(max(0.0, started + n * gap - time.monotonic()))
            if not self.live:
                break
            episode = self.load_rng.choice(self.live)
            sleep = self.load_rng.uniform(2, 10)
            flavor = "soak-big" if self.load_rng.random() < 0.25 else "cpu-basic"
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob",
                    "metadata": new_job_metadata(f"{episode['metadata']['name']}-j{n}", episode),
                    "spec": {"episode": episode["metadata"]["name"], "purpose": "train",
                             "script": f"import time\ntime.sleep({sleep:.1f})\nprint('slept')\n",
                             "flavor": flavor, "timeoutSeconds": 120}}  # fmt: skip
            pending.add(asyncio.create_task(self.create_job(body)))
        await asyncio.gather(*pending)

    async def create_job(self, body: dict[str, Any]) -> None:
        if await self.books.create("agentjobs", body) is not None:
            self.created += 1

    # -- the timeline ----------------------------------------------------------------------------

    async def run_timeline(self) -> None:
        started = time.monotonic()
        for at, action in self.timeline.events:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            try:
                await self.act(action)
            except Exception as exc:  # an action that failed is reported, never fatal to the soak
                self.soak_errors.append(f"{action} at {at:.0f} s: {exc!r}"[:600])

    def kill_containers(self, filters: str) -> int:
        """SIGKILL to the running task of every container matching containerd's `filters`."""
        ids = set(self.stack.node("ctr", "-n", "k8s.io", "containers", "ls", "-q", filters).split())
        tasks = [
            line.split() for line in self.stack.node("ctr", "-n", "k8s.io", "tasks", "ls").splitlines()[1:]
        ]
        running = [task[0] for task in tasks if task and task[0] in ids and task[-1] == "RUNNING"]
        for task in running:
            self.stack.node("ctr", "-n", "k8s.io", "tasks", "kill", "-s", "SIGKILL", task)
        return len(running)

    def pids_named(self, comm: str) -> list[str]:
        """The node's processes whose command name is exactly `comm` (no pgrep in a minimal node)."""
        script = (
            f'for p in /proc/[0-9]*; do [ "$(cat $p/comm 2>/dev/null)" = {comm} ] && echo ${{p#/proc/}}; done'
        )
        return self.stack.node("sh", "-c", script, check=False).split()

    def kill_operator(self, sigkill: bool) -> str:
        """SIGKILL to the operator's container (the kubelet restarts it), or a forced delete of its pod
        (the Deployment makes another, which waits for the old one's leader Lease)."""
        if sigkill:
            with contextlib.suppress(RuntimeError):
                if self.kill_containers(OPERATOR_CONTAINER):
                    return "operator SIGKILL"
        self.stack.cluster.kubectl(
            "-n", NAMESPACE, "delete", "pod", "-l",
            f"app.kubernetes.io/component=operator,app.kubernetes.io/instance={RELEASE}",
            "--grace-period=0", "--force", "--wait=false",
        )  # fmt: skip
        return "operator pod force-deleted"

    def kill_apiserver(self) -> str:
        """SIGKILL to the kube-apiserver's static pod container: the kubelet starts it again."""
        with contextlib.suppress(RuntimeError):
            if self.kill_containers(APISERVER_CONTAINER):
                return "kube-apiserver SIGKILL"
        pids = self.pids_named("kube-apiserver")
        if not pids:
            raise RuntimeError("no running kube-apiserver to kill")
        self.stack.node("kill", "-9", *pids)
        return "kube-apiserver SIGKILL"

    async def act(self, action: str) -> None:
        if action == "kill":
            sigkill = self.act_rng.random() < 0.5
            self.faults_made[await asyncio.to_thread(self.kill_operator, sigkill)] += 1
        elif action == "apiserver":
            self.faults_made[await asyncio.to_thread(self.kill_apiserver)] += 1
        elif action == "kubelet":
            await asyncio.to_thread(self.stack.node, "systemctl", "restart", "kubelet")
            self.faults_made["kubelet restart"] += 1
        elif action in ("delete", "submit") and self.live:
            episode = self.live.pop(self.act_rng.randrange(len(self.live)))
            if await self.books.end_early(action, episode["metadata"]["name"]):
                self.ended_by[action] += 1

    # -- settling and the books ------------------------------------------------------------------

    async def active_pods(self) -> list[dict[str, Any]]:
        listed = self.api.sanitize_for_serialization(
            await self.core.list_pod_for_all_namespaces(label_selector=names.MANAGED_LABEL)
        )
        ours = f"{NAMESPACE}/{self.prefix}"

        def of_this_run(pod: dict[str, Any]) -> bool:
            return str(
                (pod["metadata"].get("annotations") or {}).get(names.EPISODE_ANNOTATION, "")
            ).startswith(ours)

        return [p for p in listed["items"]
                if (p.get("status") or {}).get("phase") not in TERMINAL_PODS and of_this_run(p)]  # fmt: skip

    async def settled(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        episodes, jobs = await self.books.list("episodes"), await self.books.list("agentjobs")
        open_episodes, open_jobs = still_open(episodes, jobs)
        active = await self.active_pods()
        if open_episodes or open_jobs or active:
            left = f"{len(open_episodes)} Episodes, {len(open_jobs)} jobs open, {len(active)} pods active"
            print(f"(settling: {left})", file=sys.stderr, flush=True)
            return None
        return episodes, jobs

    def check_creations(self) -> int:
        uids: dict[str, set[str]] = {}
        keys: dict[tuple[str, str], set[str]] = {}
        for uid, seen in self.pods.pods.items():
            uids.setdefault(seen.key, set()).add(uid)
            keys.setdefault((seen.episode, seen.job), set()).add(seen.key)
        twice = {key: len(found) for key, found in uids.items() if len(found) > 1}
        if twice:
            self.violations.append(f"job pods created more than once for one key: {twice}")
        rekeyed = {job: sorted(found) for job, found in keys.items() if len(found) > 1}
        if rekeyed:
            self.violations.append(f"AgentJobs with pods under more than one key: {rekeyed}")
        return len(twice) + len(rekeyed)

    def check_books(self, episodes: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> dict[str, int]:
        by_job: dict[tuple[str, str], list[PodSeen]] = {}
        for seen in self.pods.pods.values():
            by_job.setdefault((seen.episode, seen.job), []).append(seen)
        figures: Counter[str] = Counter()
        for episode in episodes:
            name, status = episode["metadata"]["name"], episode["status"]
            self.violations += untyped_orphans(episode)
            figures["orphans left (typed)"] += len(status.get("orphanedJobs") or [])
            ledger = status["ledger"]
            on_books = ledger["settledMicroUSD"] + ledger.get("platformMicroUSD", 0)
            low = high = full = 0
            lines = []
            for job in (j for j in jobs if j["spec"]["episode"] == name):
                price = int(
                    self.stack.flavors.get(job["spec"]["flavor"], {}).get("priceMicroUSDPerMinute", 0)
                )
                for seen in by_job.get((f"{NAMESPACE}/{name}", job["metadata"]["name"]), []):
                    bill = bill_of(seen, price)
                    low, high, full = low + bill.low, high + bill.high, full + bill.full
                    figures[f"pods {bill.how}"] += 1
                    lines.append(f"  job {job['metadata']['name']}: {job_seen(job)}; pod {seen.namespace}/"
                                 f"{seen.name} started {seen.started}, {bill}")  # fmt: skip
            if not low <= on_books <= high:
                figures["Episodes off their bill"] += 1
                self.violations.append(f"episode {name}: settled + platform {on_books} outside the bill "
                                       f"{low}..{high}")  # fmt: skip
                self.violations += lines
            elif high >= UNSEEN:
                figures["Episodes with a pod whose end the watch missed"] += 1
            elif low == high:
                figures["Episodes exactly on their bill"] += 1
            else:
                figures["Episodes within a cancelled pod's range"] += 1
            if on_books != full:
                figures["Episodes whose books differ from the containers' full run"] += 1
        return dict(figures)


async def soak(args: argparse.Namespace, stack: Stack) -> int:
    run = Soak(args, stack)
    await run.start()
    watchers = [asyncio.create_task(run.books.watch_episodes()), asyncio.create_task(run.pods.run())]
    jobs: list[dict[str, Any]] = []
    episodes: list[dict[str, Any]] = []
    books: dict[str, int] = {}
    try:
        await run.make_episodes()
        started = time.monotonic()
        await asyncio.gather(run.load(args.minutes * 60), run.run_timeline())
        soaked = time.monotonic() - started
        outcome = None
        while outcome is None and time.monotonic() - started < soaked + args.settle_timeout:
            with contextlib.suppress(*UNREACHABLE, client.ApiException):
                outcome = await run.settled()
            if outcome is None:
                await asyncio.sleep(5)
        settle_seconds = time.monotonic() - started - soaked
        await asyncio.sleep(3)  # the pod watch's last events
        if outcome is None:
            run.violations.append(f"not settled {args.settle_timeout:.0f} s after the faults stopped")
            jobs = await run.books.list("agentjobs")
            open_episodes, open_jobs = still_open(await run.books.list("episodes"), jobs)
            run.violations += [f"  open episode {e['metadata']['name']}: {e.get('status', {}).get('phase')}"
                               for e in open_episodes[:10]]  # fmt: skip
            run.violations += [f"  open job {j['metadata']['name']}: {job_seen(j)}" for j in open_jobs[:10]]
        else:
            episodes, jobs = outcome
            books = run.check_books(episodes, jobs)
        doubled = run.check_creations()
        active = await run.active_pods()
        if active:
            left = [f"{p['metadata']['namespace']}/{p['metadata']['name']} {p['status'].get('phase')}"
                    for p in active]  # fmt: skip
            run.violations.append(f"{len(active)} job pods left Pending or Running: {left[:20]}")
    finally:
        for watcher in watchers:
            watcher.cancel()
        await run.api.close()
    violations = run.books.violations + run.violations
    phases = Counter((j.get("status") or {}).get("phase", "none") for j in jobs)
    reasons = Counter((j.get("status") or {}).get("reason", "none") for j in jobs)
    waits = sorted(s.capacity_wait for s in run.pods.pods.values() if s.capacity_wait is not None)
    pending = sum(1 for s in run.pods.pods.values() if s.unschedulable_since is not None)
    operator_restarts = stack.cluster.kubectl("-n", NAMESPACE, "get", "pods", "-l",
                                              "app.kubernetes.io/component=operator", "-o",
                                              "jsonpath={range .items[*]}{.metadata.name} "
                                              "{.status.containerStatuses[0].restartCount}{'\\n'}{end}",
                                              check=False).strip().replace("\n", ", ")  # fmt: skip
    drawn = sum(run.timeline.count(a) for a in ("kill", "apiserver", "kubelet"))
    lines = [
        f"seed                {args.seed}",
        f"cluster             kind {CLUSTER}, one node; allocatable cpu {stack.allocatable.get('cpu')}, "
        f"memory {stack.allocatable.get('memory')}; soak-big memory {stack.flavors['soak-big']['memory']}",
        f"soak                {soaked:.0f} s, {run.created} AgentJobs created into {args.episodes} Episodes; "
        f"settled {settle_seconds:.0f} s after the faults stopped",
        f"faults injected     {sum(run.faults_made.values())} of {drawn} drawn",
        *(f"    {n:4d}  {what}" for what, n in sorted(run.faults_made.items())),
        f"operator pods now   {operator_restarts} (name, container restarts)",
        f"episodes ended early {dict(run.ended_by)}; Episodes left to compare with the bill: {len(episodes)}",
        f"job pods            {len(run.pods.pods)} seen; {pending} Pending for capacity (Unschedulable), "
        f"{len(waits)} of them later scheduled, wait p50 {waits[len(waits) // 2] if waits else 0:.0f} s, "
        f"max {waits[-1] if waits else 0:.0f} s; watch re-lists {run.pods.relists}, "
        f"ends missed {run.pods.missed}",
        f"job phases          {dict(phases)}",
        f"job reasons         {dict(reasons.most_common(8))}",
        f"Episode versions    {run.books.versions} checked for reserved + settled <= budget",
        f"books               {books}; pods created twice: {doubled}; pods left active: {len(active)}",
        f"soak's own errors   {len(run.soak_errors)}",
        *(f"    {e}" for e in run.soak_errors),
        f"violations          {len(violations)}",
        *(f"    {v}" for v in violations[:60]),
    ]
    print("\n".join(lines), flush=True)
    return 1 if violations else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=6.0, help="how long jobs arrive and faults happen")
    parser.add_argument("--episodes", type=int, default=24)
    parser.add_argument("--jobs", type=int, default=240, help="AgentJobs created over the soak")
    parser.add_argument("--budget", default="0.004", help="each Episode's budget, USD")
    parser.add_argument("--kills", type=int, default=4, help="operator kills")
    parser.add_argument("--apiserver-restarts", type=int, default=2)
    parser.add_argument("--kubelet-restarts", type=int, default=3)
    parser.add_argument("--settle-timeout", type=float, default=600.0,
                        help="seconds everything may take to settle after the faults stop")  # fmt: skip
    parser.add_argument("--keep", action="store_true", help="keep the kind cluster (and its release)")
    parser.add_argument("--reuse", action="store_true",
                        help="soak on the cluster an earlier run kept, if there is one (its Episodes are "
                             "named apart by the seed)")  # fmt: skip
    args = parser.parse_args()
    print(f"pods soak, seed {args.seed}", flush=True)
    stack = None
    try:
        stack = (kept() if args.reuse else None) or bring_up(args.reuse)
        code = asyncio.run(soak(args, stack))
    finally:
        tear_down(stack, args.keep)
    sys.exit(code)


if __name__ == "__main__":
    main()
