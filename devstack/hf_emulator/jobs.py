"""Running each job for real as a local process (its state is in `job_state.py`).

As root, each job runs isolated (`isolation.py`, `jail.py`): its own PID, mount, network, IPC, UTS
and user namespaces, a file system view of its own tree and the interpreter only, and (on cgroup v1)
its own cgroup with memory and pids limits from its flavor. Whatever ends a job, the emulator makes
sure none of its processes is left before the stage turns terminal. Without root, jobs run as plain
processes in their own process group.

A job's command must start with "python" (the launcher image's entrypoint is
`python -m posttrain_launcher`); "python" is replaced by the configured interpreter. The job runs in
`<data>/jobs/<id>/work` with a clean environment (nothing of the emulator's own environment leaks in,
so a test can prove that the only secrets a job sees are those its spec carries) and with
`POSTTRAIN_ROOT=<data>/jobs/<id>/root`, under which every volume's mountPath is laid out:
- model/dataset/space volumes: read-only links to the repo store (`repos.py`);
- read-only bucket volumes: a read-only copy of the bucket folder;
- writable bucket volumes: an empty directory owned by the job user, published into the bucket when
  the job ends and before its stage turns terminal, so a client that sees COMPLETED can read them.
"""

from __future__ import annotations

import contextlib
import math
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from devstack.hf_emulator.hardware import FLAVORS
from devstack.hf_emulator.job_state import Job, LogLine, iso_z
from devstack.hf_emulator.repos import RepoNotFound, RepoStore
from devstack.hf_emulator.validation import VolumeSpec
from devstack.sandbox.isolation import JAIL_SCRIPT, JOB_UID, Isolation, JobLimits
from devstack.sandbox.trees import UnsafeTree, check_publishable, copy_regular_file, make_read_only

MAX_LOG_LINES = 200_000
KILL_GRACE_SECONDS = 3.0
# How long ending a job may take once its processes are told to die, before the emulator says so.
CONFIRM_SECONDS = 30.0
RESOURCE_CHECK_SECONDS = 0.25


@dataclass
class RunnerConfig:
    data_dir: Path
    interpreter: str
    extra_env: dict[str, str]
    scheduling_delay: float
    execute: bool  # False: no process; the job "runs" for simulated_runtime seconds (benchmarks)
    simulated_runtime: float
    isolation: Isolation | None = None  # None: plain processes (the emulator is not root)


class JobRunner:
    """Runs one job in its own thread; every state change happens under `cond` and notifies it."""

    def __init__(
        self,
        job: Job,
        config: RunnerConfig,
        repos: RepoStore,
        cond: threading.Condition,
    ) -> None:
        self.job = job
        self.config = config
        self.repos = repos
        self.cond = cond
        self.job_dir = config.data_dir / "jobs" / job.id
        self.root = self.job_dir / "root"
        self.work = self.job_dir / "work"
        self._reader: threading.Thread | None = None
        self._outputs: list[tuple[Path, Path]] = []  # (dir in the job tree, bucket dir)
        self._read_only: list[Path] = []  # read-only volumes, bound read-only into the job's view
        self.limits: JobLimits | None = None
        self.thread = threading.Thread(target=self._run, name=f"job-{job.id}", daemon=True)

    def start(self) -> None:
        self.thread.start()

    # -- state helpers (callers hold no lock) -------------------------------------------------

    def _log(self, text: str) -> None:
        with self.cond:
            if len(self.job.logs) < MAX_LOG_LINES:
                self.job.logs.append(LogLine(time.time(), text))
            elif len(self.job.logs) == MAX_LOG_LINES:
                self.job.logs.append(LogLine(time.time(), "[emulator] log truncated"))
            self.cond.notify_all()

    def _finish(self, stage: str, message: str | None) -> None:
        with self.cond:
            job = self.job
            if not job.terminal:  # a cancel may already have set CANCELED
                job.stage, job.message = stage, message
                job.finished_at = time.time()
            self.cond.notify_all()

    # -- the job ------------------------------------------------------------------------------

    def _run(self) -> None:
        job = self.job
        if self.config.scheduling_delay > 0:
            job.wake.wait(self.config.scheduling_delay)
        with self.cond:
            if job.terminal:  # canceled while scheduling
                return
        try:
            argv = self._prepare()
        except (RepoNotFound, OSError, ValueError) as exc:
            self._finish("ERROR", f"failed to start: {exc}")
            return
        with self.cond:
            if job.terminal:
                return
            job.stage, job.started_at = "RUNNING", time.time()
            job.logs.append(LogLine(job.started_at, f"===== Job started at {iso_z(job.started_at)} ====="))
            self.cond.notify_all()
        if argv is not None:
            # Outside the lock; a cancel meanwhile is seen by _supervise, which then kills the process.
            try:
                job.proc = self._spawn(argv)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                self._end_processes()
                self._finish("ERROR", f"failed to start: {exc}")
                return
        stage, message = self._supervise()
        leftover = self._end_processes()
        if leftover is not None:
            stage, message = "ERROR", leftover
        refused = self._publish_outputs()
        if refused is not None and stage == "COMPLETED":
            stage, message = "ERROR", refused
        self._finish(stage, message)

    def _prepare(self) -> list[str] | None:
        spec = self.job.spec
        if self.config.execute and spec.command[0] != "python":
            raise ValueError(f"the emulator runs only python commands, not {spec.command[0]!r}")
        self.root.mkdir(parents=True)
        self.work.mkdir(parents=True)
        for volume in spec.volumes:
            self._mount(volume)
        # The work dir stays the container's (root's): a job the launcher runs as JOB_UID writes on the
        # host's disk only into its outputs, which the launcher bounds in total; its HOME and TMPDIR are
        # in the jail's /tmp, a tmpfs bounded by its memory.
        if not self.config.execute:
            return None
        return [self.config.interpreter, *spec.command[1:], *spec.arguments]

    def _mount(self, volume: VolumeSpec) -> None:
        dest = self.root / volume.mount_path.lstrip("/")
        if volume.type != "bucket":
            self.repos.materialize(volume.type, volume.source, volume.revision, volume.path, dest)
            self._read_only.append(dest)
            return
        bucket = self.config.data_dir / "buckets" / volume.source
        source = bucket / volume.path if volume.path else bucket
        if volume.read_only:
            dest.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir() and not source.is_symlink():
                shutil.copytree(source, dest, symlinks=True, copy_function=copy_regular_file)
            else:
                dest.mkdir()
            make_read_only(dest)
            self._read_only.append(dest)
            return
        dest.mkdir(parents=True)
        if os.geteuid() == 0:
            os.chown(dest, JOB_UID, JOB_UID)
        self._outputs.append((dest, source))

    def _spawn(self, argv: list[str]) -> subprocess.Popen[bytes]:
        isolation = self.config.isolation
        flavor = FLAVORS[self.job.spec.flavor]
        if isolation is not None:
            self.limits = isolation.limits(flavor)
        env = self._environment()
        if isolation is None or self.limits is None:
            proc = subprocess.Popen(
                argv,
                cwd=self.work,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its own process group, so cancel/timeout kill every descendant
            )
        else:
            proc = self._spawn_jailed(isolation, self.limits, argv, env)
        assert proc.stdout is not None
        self._reader = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self._reader.start()
        # A separate waiter: the exit must be noticed even if a descendant keeps the pipe open.
        threading.Thread(target=self._wait, args=(proc,), daemon=True).start()
        return proc

    def _environment(self) -> dict[str, str]:
        """The job's whole environment: nothing of the emulator's own but PATH."""
        job, spec = self.job, self.job.spec
        flavor = FLAVORS[spec.flavor]
        if self.limits is not None:
            flavor_env = self.limits.flavor_env()
        else:
            flavor_env = {"CPU_CORES": str(flavor.cpu_cores), "MEMORY": flavor.ram.replace(" GB", "Gi")}
        return {
            "PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"),
            "LANG": "C.UTF-8",
            "HOME": str(self.work),
            "PYTHONUNBUFFERED": "1",
            **self.config.extra_env,
            **spec.environment,
            **spec.secrets,
            "JOB_ID": job.id,
            "ACCELERATOR": spec.flavor if flavor.gpu_model else "none",
            **flavor_env,
            "POSTTRAIN_ROOT": str(self.root),
        }

    def _spawn_jailed(
        self, isolation: Isolation, limits: JobLimits, argv: list[str], env: dict[str, str]
    ) -> subprocess.Popen[bytes]:
        """The job under the jail (`jail.py`), in a cgroup of its own; the jail reads its spec on stdin."""
        job = self.job
        job.cgroup = isolation.job_cgroup(job.id, limits)
        jail = isolation.jail_spec(
            argv=argv,
            env=env,
            cwd=self.work,
            job_dir=self.job_dir,
            writable=[self.root, self.work],
            read_only=self._read_only,
            limits=limits,
            cgroup=job.cgroup,
        )
        proc = subprocess.Popen(
            # -I -S: the jail is standard library only, and must not pick up the host's site.
            [sys.executable, "-I", "-S", JAIL_SCRIPT],
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        assert proc.stdin is not None
        try:
            with proc.stdin:
                proc.stdin.write(jail.to_json().encode())
        except OSError:
            proc.kill()
            proc.wait()
            raise
        return proc

    def _read(self, stream: IO[bytes]) -> None:
        for raw in stream:
            self._log(raw.decode("utf-8", "replace").rstrip("\r\n"))

    def _wait(self, proc: subprocess.Popen[bytes]) -> None:
        proc.wait()
        self.job.wake.set()

    def _resource_failure(self) -> str | None:
        """Why the job must end for want of memory or processes, if it must."""
        cgroup, limits = self.job.cgroup, self.limits
        if cgroup is None or limits is None:
            return None
        try:
            if cgroup.process_limit_hits() > 0:
                return f"the job reached its limit of {limits.max_processes} processes and threads"
            if cgroup.oom_kills() > 0:
                return (
                    f"out of memory: the job used all of its {limits.memory_bytes} bytes "
                    f"(flavor {self.job.spec.flavor}) and the kernel killed a process of it"
                )
        except (OSError, ValueError):
            return None
        return None

    def _supervise(self) -> tuple[str, str | None]:
        job = self.job
        assert job.started_at is not None
        deadline = job.started_at + job.spec.timeout_seconds
        if not self.config.execute:
            deadline = min(deadline, job.started_at + self.config.simulated_runtime)
        fail_at = job.started_at + job.fail_after if job.fail_after is not None else math.inf
        while True:
            job.wake.clear()
            now = time.time()
            with self.cond:
                end_requested = job.end_requested
            if end_requested:
                self._kill()
                return "CANCELED", None
            if job.vanished(now):
                self._kill()
                return "ERROR", "vanished (injected fault)"
            if job.fail_after is not None and now >= fail_at:
                self._kill()
                return "ERROR", job.fail_message
            resource_failure = self._resource_failure()
            if resource_failure is not None:
                self._kill(grace=False)
                return "ERROR", resource_failure
            if job.proc is not None and job.proc.poll() is not None:
                self._drain()
                code = job.proc.returncode
                job.exit_code = code
                resource_failure = self._resource_failure()
                if resource_failure is not None:
                    return "ERROR", resource_failure
                return ("COMPLETED", None) if code == 0 else ("ERROR", f"Job failed with exit code: {code}")
            if now >= deadline:
                if job.proc is None:
                    return "COMPLETED", None
                self._kill()
                return "ERROR", f"timeout: the job exceeded its timeout of {job.spec.timeout_seconds}s"
            # Job faults may be added later, so re-read them on each wake-up.
            fail_at = job.started_at + job.fail_after if job.fail_after is not None else math.inf
            vanish = job.vanish_at if job.vanish_at is not None else math.inf
            wake_at = min(deadline, fail_at, vanish)
            if job.cgroup is not None:
                wake_at = min(wake_at, now + RESOURCE_CHECK_SECONDS)
            job.wake.wait(max(0.0, wake_at - now))

    def _kill(self, grace: bool = True) -> None:
        """SIGTERM, then after a grace period every process of the job at once.

        SIGTERM first because the launcher keeps the job in a process group of its own: it forwards
        the signal there and kills the job's leftovers itself. Isolated, "at once" is SIGUSR1 to the
        jail, which SIGKILLs the job's init, and with it its whole PID namespace; otherwise SIGKILL
        to the process group.
        """
        proc = self.job.proc
        if proc is None:
            return
        if grace:
            _signal_group(proc, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(KILL_GRACE_SECONDS)
        if self.config.isolation is not None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(CONFIRM_SECONDS)
        if proc.poll() is None:
            _signal_group(proc, signal.SIGKILL)
            proc.wait()
        _signal_group(proc, signal.SIGKILL)  # whatever is left in the group
        self.job.exit_code = proc.returncode
        self._drain()

    def _end_processes(self) -> str | None:
        """After the job's own process is gone: make sure nothing of it is left; a reason if not."""
        cgroup = self.job.cgroup
        if cgroup is None:
            return None
        try:
            if not cgroup.kill_all(CONFIRM_SECONDS):
                self._log(f"[emulator] processes of the job survived {CONFIRM_SECONDS}s of SIGKILL")
                return "processes of the job could not be stopped"
            cgroup.remove()
        except OSError as exc:
            self._log(f"[emulator] cannot confirm the job's processes are gone: {exc}")
            return "the end of the job's processes could not be confirmed"
        return None

    def _drain(self) -> None:
        # A descendant that left the process group can hold the pipe open: don't wait for it forever.
        if self._reader is not None:
            self._reader.join(KILL_GRACE_SECONDS)

    def _publish_outputs(self) -> str | None:
        """Copy each writable bucket volume into its bucket; a refusal's reason, if any.

        Runs once no process of the job is left, so nothing changes the tree while it is checked.
        A tree with a link leading outside itself, or a FIFO, socket or device, is not published
        at all: a later job mounting the bucket, or the emulator serving it, must never be led
        out of it.
        """
        for src, _ in self._outputs:
            try:
                check_publishable(src)
            except (UnsafeTree, OSError) as exc:
                reason = f"outputs not published: {exc}"
                self._log(f"[emulator] {reason}")
                return reason
        for src, bucket_dir in self._outputs:
            try:
                bucket_dir.mkdir(parents=True, exist_ok=True)
                shutil.copytree(
                    src, bucket_dir, symlinks=True, dirs_exist_ok=True, copy_function=copy_regular_file
                )
            except (OSError, shutil.Error) as exc:
                self._log(f"[emulator] could not publish outputs to the bucket: {exc}")
        return None


def _signal_group(proc: subprocess.Popen[bytes], sig: signal.Signals) -> None:
    # The group outlives its leader while members remain, so signal it even after the exit.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)
