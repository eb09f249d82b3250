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
import random
import sys
import time
from collections import Counter
from typing import Any

from admissions import BENCH_AGENT, GROUP, VERSION
from kubernetes_asyncio import client, config
from posttrain_operator.api.rules import new_job_metadata
from posttrain_operator.backends.pods import names
from soak_checks import UNREACHABLE, EpisodeBooks, job_seen, steady_load, still_open, untyped_orphans
from soak_faults import Timeline
from soak_kind import (
    APISERVER_CONTAINER,
    CLUSTER,
    NAMESPACE,
    OPERATOR_CONTAINER,
    RELEASE,
    TASK,
    Stack,
    bring_up,
    kept,
    tear_down,
)
from soak_pods import TERMINAL_PODS, UNSEEN, PodSeen, PodWatch, bill_of


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
        self.created = await steady_load(
            self.books, self.live, self.load_rng, self.args.jobs, seconds, self.job_body
        )

    def job_body(self, n: int, episode: dict[str, Any]) -> dict[str, Any]:
        sleep = self.load_rng.uniform(2, 10)
        flavor = "soak-big" if self.load_rng.random() < 0.25 else "cpu-basic"
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob",
                "metadata": new_job_metadata(f"{episode['metadata']['name']}-j{n}", episode),
                "spec": {"episode": episode["metadata"]["name"], "purpose": "train",
                         "script": f"import time\ntime.sleep({sleep:.1f})\nprint('slept')\n",
                         "flavor": flavor, "timeoutSeconds": 120}}  # fmt: skip

    # -- the timeline ----------------------------------------------------------------------------

    async def run_timeline(self) -> None:
        await self.timeline.run(self.act, self._action_failed)

    def _action_failed(self, action: str, at: float, exc: Exception) -> None:
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
