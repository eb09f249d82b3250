"""Chaos soak: thousands of admissions over several minutes while every part fails at seeded moments.

    python bench/chaos_soak.py --seed 1 [--minutes 6] [--episodes 150] [--jobs 3000]

Against its own devstack control plane and the HF Jobs emulator (jobs 'run' for a minute without a
process), with the operator as a real `kopf run` process. While AgentJobs arrive at a steady rate
into Episodes that each hold a few jobs at a time and a small budget, a timeline drawn from the seed:

- kills the operator (SIGKILL) and starts it again;
- restarts the kube-apiserver (etcd and the controllers keep running);
- makes the emulator answer creates, inspects, lists and cancels with 5xx, 429, dropped connections,
  lost responses (the job is created, the answer never comes), hangs past the client's timeout and
  slow answers;
- ends Episodes early with jobs running: deleted, or submitted (a grader job then runs); the others
  end at their wall-clock limit.

Then the faults stop and the soak waits until everything has settled, and checks from outside:
every AgentJob terminal; no backend job created twice or left running; `reserved + settled <=
budget` on every Episode version a watch delivered; settled plus platform spend equal to what the
backend billed, for every ended Episode; no orphan left untyped. It prints its seed, the faults it
made, the figures, and every violation; it exits non-zero on any.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import random
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
from admissions import BENCH_AGENT, GROUP, REPO, VERSION
from kubernetes_asyncio import client, config
from posttrain_operator.api.rules import new_job_metadata
from posttrain_operator.backends.hf_client import EPISODE_LABEL, KEY_LABEL
from posttrain_operator.backends.hf_replies import label_value
from soak_checks import EpisodeBooks, job_seen, steady_load, still_open, untyped_orphans
from soak_faults import FAULT_ROUTES, Timeline, backend_fault

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import Fault
from devstack.hf_emulator.repos import remove_tree
from tests.integration.support import OperatorProcess, make_emulator, register_placeholder_repos

ACTIVE = {"stage": ["RUNNING", "SCHEDULING"]}
JOB_SECONDS = 60.0  # how long a backend job runs unless cancelled
SETTLE_TIMEOUT = 900.0  # after the faults stop, how long everything may take to settle


def job_body(n: int, episode: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob",
            "metadata": new_job_metadata(f"{episode['metadata']['name']}-j{n}", episode),
            "spec": {"episode": episode["metadata"]["name"], "purpose": "train", "script": "print(1)",
                     "flavor": "cpu-basic", "timeoutSeconds": 240}}  # fmt: skip


class Soak:
    """The stack, the load and the observations of one seeded run."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rng = random.Random(args.seed)
        self.timeline = Timeline.draw(self.rng, args.minutes * 60, kills=args.kills,
                                      apiserver_restarts=args.apiserver_restarts, faults=args.faults,
                                      episodes=args.episodes)  # fmt: skip
        self.violations: list[str] = []
        self.created = 0
        self.ended_by: Counter[str] = Counter()
        self.live: list[dict[str, Any]] = []  # Episodes the load still sends jobs to
        self.faults_made: Counter[str] = Counter()
        self.faults: list[Fault] = []  # hits are counted on them as requests meet them

    async def start(self) -> None:
        self.state = devcluster.up(f"soak-{self.args.seed}")
        kubectl = [str(self.state.kubectl()), f"--kubeconfig={self.state.kubeconfig}"]
        proc = await asyncio.create_subprocess_exec(
            *kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"),
            stdout=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
        assert await proc.wait() == 0, "the CRDs did not apply"
        self.namespace = f"soak-{uuid.uuid4().hex[:6]}"
        self.emulator, self.data_dir = make_emulator(
            execute=False, simulated_runtime=JOB_SECONDS, page_size=50
        )
        register_placeholder_repos(self.emulator, Path(tempfile.mkdtemp()) / "repos")
        await config.load_kube_config(str(self.state.kubeconfig))
        self.api = client.ApiClient()
        self.api.user_agent = BENCH_AGENT
        self.custom = client.CustomObjectsApi(self.api)
        self.books = EpisodeBooks(self.custom, self.namespace)
        await client.CoreV1Api(self.api).create_namespace({"metadata": {"name": self.namespace}})
        self.operator = OperatorProcess(
            self.state, self.emulator, Path(tempfile.mkdtemp(prefix="soak-operator-")), self.namespace,
            POSTTRAIN_POLL_INTERVAL_SECONDS="2", POSTTRAIN_EPISODE_TICK_SECONDS="2",
            POSTTRAIN_HF_HTTP_TIMEOUT_SECONDS="5",
        ).start()  # fmt: skip
        await asyncio.to_thread(self.operator.wait_ready)

    async def stop(self) -> None:
        self.operator.stop()
        self.emulator.stop()
        remove_tree(self.data_dir)
        await self.api.close()
        devcluster.down(self.state.name)

    # -- the load --------------------------------------------------------------------------------

    async def make_episodes(self) -> None:
        for e in range(self.args.episodes):
            wall = int(self.rng.uniform(0.4, 1.3) * self.args.minutes * 60)
            body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "Episode", "metadata": {"name": f"ep{e:03d}"},
                    "spec": {"task": "t0_artifact", "budgetUSD": "0.005", "backend": "hf-jobs",
                             "limits": {"maxConcurrentJobs": 4, "maxWallSeconds": wall,
                                        "maxJobTimeoutSeconds": 300}}}  # fmt: skip
            created = await self.books.create("episodes", body)
            if created is not None:
                self.live.append(created)

    async def load(self, seconds: float) -> None:
        """AgentJobs at a steady rate into live Episodes, made as the gateway makes them."""
        self.created = await steady_load(self.books, self.live, self.rng, self.args.jobs, seconds, job_body)

    # -- the timeline ----------------------------------------------------------------------------

    async def run_timeline(self) -> None:
        await self.timeline.run(self.act, self._action_failed)

    def _action_failed(self, action: str, _at: float, exc: Exception) -> None:
        self.violations.append(f"the soak's own action {action} failed: {exc!r}")

    async def act(self, action: str) -> None:
        if action == "kill":
            self.operator.kill()
            self.operator.start()
        elif action == "apiserver":
            await asyncio.to_thread(devcluster.stop_apiserver, self.state)
            await asyncio.sleep(self.rng.uniform(1, 5))
            await asyncio.to_thread(devcluster.start_apiserver, self.state)
        elif action == "fault":
            fault = backend_fault(self.rng)
            self.faults.append(self.emulator.controls.add_fault(fault))
            self.faults_made[f"{fault.kind} {FAULT_ROUTES[fault.route]}"] += 1
        elif action in ("delete", "submit") and self.live:
            episode = self.live.pop(self.rng.randrange(len(self.live)))
            if await self.books.end_early(action, episode["metadata"]["name"]):
                self.ended_by[action] += 1

    # -- observation -----------------------------------------------------------------------------

    async def settled(self) -> tuple[list[dict[str, Any]], list[dict[str, Any]]] | None:
        """Once every Episode has ended with nothing reserved, every job is terminal and the backend
        runs nothing: the Episodes and the jobs."""
        episodes, jobs = await self.books.list("episodes"), await self.books.list("agentjobs")
        open_episodes, open_jobs = still_open(episodes, jobs)
        running = self.emulator.count_jobs(self.emulator.namespace, ACTIVE)
        if open_episodes or open_jobs or running:
            left = f"{len(open_episodes)} Episodes, {len(open_jobs)} jobs open, {running} on the backend"
            print(f"(settling: {left})", file=sys.stderr, flush=True)
            return None
        return episodes, jobs

    def check_books(self, episodes: list[dict[str, Any]], jobs: list[dict[str, Any]]) -> dict[str, int]:
        creations = self.emulator.creations_by_label(KEY_LABEL)
        twice = {key: n for key, n in creations.items() if n > 1}
        if twice:
            self.violations.append(f"backend jobs created more than once: {twice}")
        billed: Counter[str] = Counter()
        by_job = {}
        for record in self.emulator.billing():
            billed[self.emulator.job(record.job_id)["labels"].get(EPISODE_LABEL, "")] += record.cost_micro_usd
            by_job[record.job_id] = record
        mismatched = 0
        for episode in episodes:
            status, name = episode["status"], episode["metadata"]["name"]
            ledger = status["ledger"]
            on_books = ledger["settledMicroUSD"] + ledger.get("platformMicroUSD", 0)
            bill = billed[label_value(f"{self.namespace}-{name}")]
            if on_books != bill:
                mismatched += 1
                self.violations.append(f"episode {name}: settled + platform {on_books} != billed {bill}")
                self.violations += self.job_books(name, jobs, by_job)
            self.violations += untyped_orphans(episode)
        return {"double creations": len(twice), "billing mismatches": mismatched}

    def job_books(self, episode: str, jobs: list[dict[str, Any]], by_job: dict[str, Any]) -> list[str]:
        """Each of the Episode's jobs whose settlement differs from its bill, with what both sides saw."""
        found = []
        for job in jobs:
            status = job.get("status") or {}
            record = by_job.get(status.get("backendJobId") or "")
            if job["spec"]["episode"] != episode or record is None:
                continue
            if (status.get("settledMicroUSD") or 0) != record.cost_micro_usd:
                found.append(f"  job {job['metadata']['name']}: {job_seen(job)}; billed {record}")
        return found


async def soak(args: argparse.Namespace) -> int:
    run = Soak(args)
    await run.start()
    watcher = asyncio.create_task(run.books.watch_episodes())
    try:
        await run.make_episodes()
        started = time.monotonic()
        await asyncio.gather(run.load(args.minutes * 60), run.run_timeline())
        run.emulator.controls.clear_faults()
        run.emulator.controls.release_hangs()
        soaked = time.monotonic() - started
        outcome = None
        while outcome is None and time.monotonic() - started < soaked + SETTLE_TIMEOUT:
            with contextlib.suppress(OSError, asyncio.TimeoutError, aiohttp.ClientError):
                outcome = await run.settled()
            await asyncio.sleep(5)
        settle_seconds = time.monotonic() - started - soaked
        if outcome is None:
            run.violations.append(f"not settled {SETTLE_TIMEOUT:.0f} s after the faults stopped")
            books: dict[str, int] = {}
            episodes, jobs = [], await run.books.list("agentjobs")
        else:
            episodes, jobs = outcome
            books = run.check_books(episodes, jobs)
        left_running = run.emulator.count_jobs(run.emulator.namespace, ACTIVE)
        if left_running:
            run.violations.append(f"{left_running} backend jobs left running")
    finally:
        watcher.cancel()
        await run.stop()
    violations = run.books.violations + run.violations
    phases = Counter((j.get("status") or {}).get("phase", "none") for j in jobs)
    reasons = Counter((j.get("status") or {}).get("reason", "none") for j in jobs)
    fault_hits = sum(f.hits for f in run.faults)
    lines = [
        f"seed                {args.seed}",
        f"soak                {soaked:.0f} s, {run.created} AgentJobs created into {args.episodes} Episodes; "
        f"settled {settle_seconds:.0f} s after the faults stopped",
        f"operator kills      {run.timeline.count('kill')} (operator started {run.operator.starts} times)",
        f"apiserver restarts  {run.timeline.count('apiserver')}",
        f"backend faults      {sum(run.faults_made.values())} injected, {fault_hits} requests hit",
        *(f"    {n:4d}  {what}" for what, n in sorted(run.faults_made.items())),
        f"episodes ended early {dict(run.ended_by)}; Episodes left to compare with the bill: {len(episodes)}",
        f"job phases          {dict(phases)}",
        f"job reasons         {dict(reasons.most_common(8))}",
        f"Episode versions    {run.books.versions} checked for reserved + settled <= budget",
        f"books               {books}; backend jobs left running: {left_running}",
        f"violations          {len(violations)}",
        *(f"    {v}" for v in violations[:40]),
    ]
    print("\n".join(lines))
    return 1 if violations else 0


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--minutes", type=float, default=6.0, help="how long jobs arrive and faults happen")
    parser.add_argument("--episodes", type=int, default=150)
    parser.add_argument("--jobs", type=int, default=3000, help="AgentJobs created over the soak")
    parser.add_argument("--kills", type=int, default=6, help="operator kills")
    parser.add_argument("--apiserver-restarts", type=int, default=2)
    parser.add_argument("--faults", type=int, default=240, help="backend faults injected")
    sys.exit(asyncio.run(soak(parser.parse_args())))


if __name__ == "__main__":
    main()
