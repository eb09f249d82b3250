"""The emulator's state and public Python API; the HTTP side is in `http_api.py`."""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

from devstack.hf_emulator.controls import EmulatorControls, apply_job_fault
from devstack.hf_emulator.errors import ApiError
from devstack.hf_emulator.faults import FaultBook
from devstack.hf_emulator.http_api import EmulatorServer
from devstack.hf_emulator.hub_api import DEFAULT_MAX_COMMIT_BYTES
from devstack.hf_emulator.hub_repos import HubRepos
from devstack.hf_emulator.job_state import Job, request_end
from devstack.hf_emulator.jobs import CONFIRM_SECONDS, KILL_GRACE_SECONDS, JobRunner, RunnerConfig
from devstack.hf_emulator.records import BillingRecord, RecordedRequest, Stats
from devstack.hf_emulator.repos import RepoStore
from devstack.hf_emulator.validation import SpecError, parse_job_spec
from devstack.sandbox.isolation import isolation_for

log = logging.getLogger(__name__)

DEFAULT_TOKEN = "hf_emulator_token"
DEFAULT_NAMESPACE = "posttrain-dev"
CANCEL_ANSWER_SECONDS = KILL_GRACE_SECONDS + 2.0


def _prepare_data_dir(path: Path) -> Path:
    data_dir = path.resolve()
    data_dir.mkdir(parents=True, exist_ok=True)
    # uid 10000 (the launcher's) must traverse into job trees; the repo store stays 0700.
    data_dir.chmod(0o711)
    for sub in ("jobs", "buckets"):
        (data_dir / sub).mkdir(exist_ok=True)
        (data_dir / sub).chmod(0o711)
    blocked = [p for p in data_dir.parents if not p.stat().st_mode & 0o001]
    if os.geteuid() == 0 and blocked:
        log.warning(
            "uid 10000 cannot traverse %s: launcher jobs will fail; use another --data-dir", blocked[0]
        )
    return data_dir


class HfEmulator:
    """An HF Jobs API on a loopback port that runs each job as a local process.

    Use as a context manager (or `start()`/`stop()`); `url` is the `HfApi(endpoint=...)` to use.
    """

    def __init__(
        self,
        data_dir: Path | str,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str = DEFAULT_TOKEN,
        namespace: str = DEFAULT_NAMESPACE,
        orgs: tuple[str, ...] = (),
        interpreter: str = sys.executable,
        extra_env: dict[str, str] | None = None,
        page_size: int = 50,
        tree_page_size: int = 1000,
        scheduling_delay: float = 0.0,
        execute: bool = True,
        simulated_runtime: float = 3600.0,
        keepalive_seconds: float = 30.0,
        metrics_interval: float = 1.0,
        isolate: bool | None = None,
        max_job_memory_bytes: int | None = None,
        max_job_processes: int | None = None,
        max_job_cpu_cores: int | None = None,
        max_commit_bytes: int = DEFAULT_MAX_COMMIT_BYTES,
    ) -> None:
        """`isolate`: run each job in namespaces and a cgroup of its own (`jobs.py`); the default is
        to do so when running as root. `max_job_memory_bytes`, `max_job_processes` and
        `max_job_cpu_cores` cap what a flavor gives a job, for a machine smaller than the flavors
        (default: the host's memory and cores).
        `max_commit_bytes` caps the body of a Hub commit (its files, base64-encoded)."""
        self.data_dir = _prepare_data_dir(Path(data_dir))
        self.token = token
        self.namespace = namespace
        self.orgs = tuple(orgs)
        self.owner_id = secrets.token_hex(12)
        self.page_size = page_size
        self.tree_page_size = tree_page_size
        self.keepalive_seconds = keepalive_seconds
        self.metrics_interval = metrics_interval
        self.repos = RepoStore(self.data_dir / "repos")
        self.hub = HubRepos(self.repos)
        self.max_commit_bytes = max_commit_bytes
        self.faults = FaultBook()
        self.isolation = isolation_for(
            execute, isolate, max_job_memory_bytes, max_job_processes, max_job_cpu_cores
        )
        self.runner_config = RunnerConfig(
            data_dir=self.data_dir,
            interpreter=interpreter,
            extra_env=dict(extra_env or {}),
            scheduling_delay=scheduling_delay,
            execute=execute,
            simulated_runtime=simulated_runtime,
            isolation=self.isolation,
        )
        self.cond = threading.Condition()
        self.stopping = False
        self._jobs: dict[str, Job] = {}
        self.controls = EmulatorControls(self.faults, self.cond, self._jobs)
        self._runners: dict[str, JobRunner] = {}
        self._seq = itertools.count(1)
        self._stats_lock = threading.Lock()
        self._stats = Stats()
        self._httpd = EmulatorServer((host, port), self)
        self._thread: threading.Thread | None = None

    # -- lifecycle ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def start(self) -> HfEmulator:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.1}, name="hf-emulator", daemon=True
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and end every running job (each confirmed gone, as on cancel)."""
        with self.cond:
            self.stopping = True
            jobs = list(self._jobs.values())
            runners = list(self._runners.values())
            for job in jobs:
                if not job.terminal:
                    job.stage, job.message, job.finished_at = "ERROR", "emulator stopped", time.time()
                request_end(job)
            self.cond.notify_all()
        deadline = time.monotonic() + KILL_GRACE_SECONDS + CONFIRM_SECONDS
        for runner in runners:
            if runner.thread.is_alive():
                runner.thread.join(max(0.0, deadline - time.monotonic()))
        for job in jobs:
            if job.proc is not None and job.proc.poll() is None:  # a runner that did not finish
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(job.proc.pid, signal.SIGKILL)
        if self.isolation is not None:
            self.isolation.close()
        self.faults.release_hangs()
        self._httpd.shutdown()
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> HfEmulator:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- observation --------------------------------------------------------------------------

    def request_counts(self) -> dict[str, int]:
        """Requests per route key (`routes.*`, e.g. "GET /api/jobs/{namespace}"), admin calls excluded."""
        with self._stats_lock:
            return dict(self._stats.counts)

    def request_count(self, route: str) -> int:
        with self._stats_lock:
            return self._stats.counts[route]

    def requests(self) -> list[RecordedRequest]:
        """Every API request received (headers and body included), oldest first."""
        with self._stats_lock:
            return list(self._stats.requests)

    def creations_by_label(self, key: str) -> dict[str, int]:
        """How many jobs were created per value of label `key` (e.g. the idempotency key)."""
        with self._stats_lock:
            return dict(self._stats.creations.get(key, {}))

    def all_creations(self) -> dict[str, dict[str, int]]:
        with self._stats_lock:
            return {k: dict(v) for k, v in self._stats.creations.items()}

    def jobs(self) -> list[dict[str, Any]]:
        """Every job as the API would return it, vanished ones included, oldest first."""
        now = time.time()
        with self.cond:
            return [j.to_wire(now) for j in sorted(self._jobs.values(), key=lambda j: j.seq)]

    def reset_stats(self) -> None:
        with self._stats_lock:
            self._stats = Stats()

    def job(self, job_id: str) -> dict[str, Any]:
        """The job as the API would return it, vanished or not (KeyError if unknown)."""
        with self.cond:
            return self._jobs[job_id].to_wire(time.time())

    def job_root(self, job_id: str) -> Path:
        """The job's POSTTRAIN_ROOT: its volumes laid out at their mount paths."""
        return self.data_dir / "jobs" / job_id / "root"

    def job_pids(self, job_id: str) -> set[int]:
        """Host pids of the job's processes now (from its cgroup; empty without one)."""
        with self.cond:
            cgroup = self._jobs[job_id].cgroup
        return cgroup.pids() if cgroup is not None else set()

    def job_cpu_quota(self, job_id: str) -> float | None:
        """The cores the kernel lets the job's processes use together (its CFS quota), or None."""
        with self.cond:
            cgroup = self._jobs[job_id].cgroup
        return cgroup.cpu_quota_cores() if cgroup is not None else None

    def job_ids(self) -> list[str]:
        with self.cond:
            return [j.id for j in sorted(self._jobs.values(), key=lambda j: j.seq)]

    def wait_for_stage(self, job_id: str, stages: tuple[str, ...], timeout: float = 30.0) -> str:
        deadline = time.monotonic() + timeout
        with self.cond:
            job = self._jobs[job_id]
            while job.stage not in stages:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"job {job_id} is {job.stage}, not in {stages}")
                self.cond.wait(remaining)
            return job.stage

    def billing(self) -> list[BillingRecord]:
        now = time.time()
        with self.cond:
            jobs = sorted(self._jobs.values(), key=lambda j: j.seq)
            return [
                BillingRecord(
                    job.id,
                    job.namespace,
                    job.spec.flavor,
                    job.billed_minutes(now),
                    job.cost_micro_usd(now),
                    job.started_at,
                    job.finished_at,
                )
                for job in jobs
            ]

    def total_cost_micro_usd(self) -> int:
        return sum(r.cost_micro_usd for r in self.billing())

    # -- buckets ------------------------------------------------------------------------------

    def bucket_path(self, bucket_id: str) -> Path:
        ns, _, name = bucket_id.partition("/")
        if not ns or not name or "/" in name or ".." in (ns, name):
            raise ValueError(f"bucket id must be 'namespace/name', not {bucket_id!r}")
        return self.data_dir / "buckets" / ns / name

    def create_bucket(self, bucket_id: str) -> Path:
        path = self.bucket_path(bucket_id)
        path.mkdir(parents=True, exist_ok=True)
        return path

    # -- endpoint implementations, called by http_api ------------------------------------------

    def record_request(
        self, method: str, path: str, route: str, headers: list[tuple[str, str]], body: bytes
    ) -> None:
        with self._stats_lock:
            self._stats.counts[route] += 1
            self._stats.requests.append(RecordedRequest(method, path, route, headers, body, time.time()))

    def visible_job(self, namespace: str, job_id: str) -> Job:
        job = self._jobs.get(job_id)
        if job is None or job.namespace != namespace or job.vanished(time.time()):
            raise ApiError(404, "Job not found")
        return job

    def check_namespace(self, namespace: str) -> None:
        if namespace != self.namespace and namespace not in self.orgs:
            raise ApiError(403, f"You don't have access to namespace {namespace}")

    def create_job(self, namespace: str, body: object) -> dict[str, Any]:
        self.check_namespace(namespace)
        try:
            spec = parse_job_spec(body)
        except SpecError as exc:
            raise ApiError(400, str(exc)) from exc
        now = time.time()
        job = Job(
            id=secrets.token_hex(12),
            namespace=namespace,
            owner_id=self.owner_id,
            spec=spec,
            seq=next(self._seq),
            created_at=now,
        )
        for kind in ("job_error", "job_vanish"):
            fault = self.faults.take_job_fault(kind, job.id, spec.labels)
            if fault is not None:
                apply_job_fault(job, fault)
        runner = JobRunner(job, self.runner_config, self.repos, self.cond)
        with self.cond:
            if self.stopping:
                raise ApiError(503, "emulator is stopping")
            self._jobs[job.id] = job
            self._runners[job.id] = runner
            wire = job.to_wire(now)
        with self._stats_lock:
            for k, v in spec.labels.items():
                self._stats.creations.setdefault(k, Counter())[v] += 1
        runner.start()
        return wire

    def cancel_job(self, namespace: str, job_id: str) -> dict[str, Any]:
        with self.cond:
            job = self.visible_job(namespace, job_id)
            if job.terminal:
                return job.to_wire(time.time())
        if self.faults.take_job_fault("cancel_ignored", job.id, job.spec.labels) is not None:
            with self.cond:
                return job.to_wire(time.time())  # accepted, not honoured
        # A job that has not started is canceled at once; a running one is ended by its runner,
        # which turns it CANCELED only once none of its processes is left. The answer waits for that
        # a little (long enough for a job that stops on SIGTERM), never longer than a client would.
        deadline = time.monotonic() + CANCEL_ANSWER_SECONDS
        with self.cond:
            if job.stage == "SCHEDULING":
                job.stage, job.message, job.finished_at = "CANCELED", None, time.time()
            request_end(job)
            self.cond.notify_all()
            while not job.terminal and (remaining := deadline - time.monotonic()) > 0:
                self.cond.wait(remaining)
            return job.to_wire(time.time())

    def list_jobs(
        self, namespace: str, query: dict[str, list[str]], cursor: int | None
    ) -> tuple[list[dict[str, Any]], int | None]:
        self.check_namespace(namespace)
        stages = {s.upper() for s in query.get("stage", [])}
        labels: list[tuple[str, str | None]] = []
        for item in query.get("label", []):
            key, sep, value = item.partition("=")
            labels.append((key, value if sep else None))
        now = time.time()
        with self.cond:
            jobs = [
                j
                for j in sorted(self._jobs.values(), key=lambda j: -j.seq)
                if j.namespace == namespace
                and not j.vanished(now)
                and (not stages or j.stage in stages)
                and all(k in j.spec.labels and (v is None or j.spec.labels[k] == v) for k, v in labels)
                and (cursor is None or j.seq < cursor)
            ]
            page = jobs[: self.page_size]
            more = len(jobs) > self.page_size
            return [j.to_wire(now) for j in page], (page[-1].seq if more else None)

    def count_jobs(self, namespace: str, query: dict[str, list[str]]) -> int:
        self.check_namespace(namespace)
        stages = {s.upper() for s in query.get("stage", [])}
        now = time.time()
        with self.cond:
            return sum(
                1
                for j in self._jobs.values()
                if j.namespace == namespace and not j.vanished(now) and (not stages or j.stage in stages)
            )
