"""A cgroup per job (cgroup v1: memory, pids, cpu, cpuacct), under the emulator's own cgroups.

Each job's cgroups sit in `<the emulator's cgroup>/hf-emulator-<random>/job-<id>` in each hierarchy,
so whatever already accounts for the emulator (a container, a CI sandbox) still accounts for its
jobs. The memory, pids and CPU limits come from the job's flavor (CPU as a CFS quota of its cores, so
a busy job cannot take a concurrent grader's share); the counters say whether the job ran out of
memory or processes, and `kill_all` is how the emulator makes sure no process of a job is left.

Only the v1 hierarchy is supported: on a host with cgroup v2 alone, creating job cgroups needs the
emulator's own cgroup to be delegated and emptied first, which this module does not do. There,
`CgroupRoot.create` raises CgroupError with the reason, and jobs run without a cgroup (their PID
namespace still ends every process, and the launcher's rlimits still bound each process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import time
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)
REQUIRED = ("memory", "pids")
OPTIONAL = ("cpu", "cpuacct")
CFS_PERIOD_US = 100_000
_POLL_SECONDS = 0.02


class CgroupError(RuntimeError):
    pass


def _v1_mounts() -> dict[str, Path]:
    """controller -> mount point of its v1 hierarchy, from /proc/self/mountinfo."""
    mounts: dict[str, Path] = {}
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        for line in fh:
            fields = line.split()
            sep = fields.index("-")
            fstype, options = fields[sep + 1], fields[sep + 3]
            if fstype != "cgroup":
                continue
            for option in options.split(","):
                mounts.setdefault(option, Path(fields[4]))
    return mounts


def _own_paths() -> dict[str, str]:
    """controller -> this process's cgroup path in that v1 hierarchy, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup", encoding="utf-8") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for controller in controllers.split(","):
                if controller:
                    paths[controller] = path
    return paths


def _read_int(path: Path, key: str | None = None) -> int:
    text = path.read_text(encoding="utf-8")
    if key is None:
        return int(text.split()[0])
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name == key:
            return int(value)
    return 0


def _distinct(dirs: dict[str, Path]) -> list[Path]:
    """Each directory once: controllers mounted together (`cpu,cpuacct`) share one."""
    return list(dict.fromkeys(dirs.values()))


@dataclass
class JobCgroup:
    dirs: dict[str, Path]  # controller -> this job's cgroup directory
    memory_bytes: int
    max_processes: int

    def procs_files(self) -> list[str]:
        return [str(d / "cgroup.procs") for d in _distinct(self.dirs)]

    def pids(self) -> set[int]:
        try:
            text = (self.dirs["pids"] / "cgroup.procs").read_text(encoding="utf-8")
        except FileNotFoundError:
            return set()
        return {int(line) for line in text.split()}

    def oom_kills(self) -> int:
        """Processes of the job the kernel killed for want of memory (v1 `memory.oom_control`)."""
        return _read_int(self.dirs["memory"] / "memory.oom_control", "oom_kill")

    def process_limit_hits(self) -> int:
        """Forks refused because the job was at its process limit (`pids.events`)."""
        return _read_int(self.dirs["pids"] / "pids.events", "max")

    def memory_usage(self) -> int:
        return _read_int(self.dirs["memory"] / "memory.usage_in_bytes")

    def cpu_quota_cores(self) -> float | None:
        """The CFS quota in cores, as the kernel holds it; None without a cpu cgroup or a quota."""
        if "cpu" not in self.dirs:
            return None
        try:
            quota = _read_int(self.dirs["cpu"] / "cpu.cfs_quota_us")
            period = _read_int(self.dirs["cpu"] / "cpu.cfs_period_us")
        except FileNotFoundError:  # the job has ended
            return None
        return None if quota < 0 else quota / period

    def cpu_seconds(self) -> float:
        if "cpuacct" not in self.dirs:
            return 0.0
        return _read_int(self.dirs["cpuacct"] / "cpuacct.usage") / 1e9

    def kill_all(self, timeout: float) -> bool:
        """SIGKILL every process in the cgroup until none is left; False if some remain at `timeout`.

        Each pid is pinned with a pidfd and checked to still be a member before the signal, so a
        pid reused by another process is never signalled.
        """
        deadline = time.monotonic() + timeout
        while True:
            pids = self.pids()
            if not pids:
                return True
            if time.monotonic() >= deadline:
                return False
            for pid in pids:
                _kill_member(pid, self.dirs["pids"])
            time.sleep(_POLL_SECONDS)

    def remove(self) -> None:
        for directory in _distinct(self.dirs):
            with contextlib.suppress(FileNotFoundError):
                directory.rmdir()


def _set_cpu_quota(directory: Path, cores: int) -> None:
    """A CFS quota of `cores`; left unbounded, with a warning, where the kernel refuses it (v1 refuses a
    child's quota above its parent's, as in a container limited to fewer cores than it sees)."""
    try:
        (directory / "cpu.cfs_period_us").write_text(str(CFS_PERIOD_US))
        (directory / "cpu.cfs_quota_us").write_text(str(cores * CFS_PERIOD_US))
    except OSError as exc:
        log.warning("job cgroup %s: no CPU quota of %d cores (%s): unbounded", directory, cores, exc)


def _kill_member(pid: int, cgroup_dir: Path) -> None:
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return
    try:
        if pid in {int(p) for p in (cgroup_dir / "cgroup.procs").read_text(encoding="utf-8").split()}:
            signal.pidfd_send_signal(fd, signal.SIGKILL)
    except ProcessLookupError:
        pass
    finally:
        os.close(fd)


class CgroupRoot:
    """This emulator's parent cgroups; one JobCgroup per job below them."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs

    @classmethod
    def create(cls) -> CgroupRoot:
        """Raises CgroupError saying why job cgroups cannot be made on this host."""
        if os.geteuid() != 0:
            raise CgroupError("the emulator is not running as root")
        mounts, own = _v1_mounts(), _own_paths()
        missing = [c for c in REQUIRED if c not in mounts or c not in own]
        if missing:
            raise CgroupError(f"no cgroup v1 hierarchy with the {', '.join(missing)} controller")
        name = f"hf-emulator-{secrets.token_hex(4)}"
        dirs: dict[str, Path] = {}
        try:
            for controller in (*REQUIRED, *OPTIONAL):
                if controller in mounts and controller in own:
                    parent = mounts[controller] / own[controller].lstrip("/") / name
                    if parent not in dirs.values():
                        parent.mkdir()
                    dirs[controller] = parent
        except OSError as exc:
            for directory in _distinct(dirs):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise CgroupError(f"cannot create cgroups: {exc}") from None
        return cls(dirs)

    @property
    def bounds_cpu(self) -> bool:
        return "cpu" in self.dirs

    def job(self, job_id: str, memory_bytes: int, max_processes: int, cpu_cores: int) -> JobCgroup:
        """Raises OSError if the cgroups cannot be made or limited (the job must not start then)."""
        dirs = {controller: parent / f"job-{job_id}" for controller, parent in self.dirs.items()}
        cgroup = JobCgroup(dirs, memory_bytes, max_processes)
        try:
            for directory in _distinct(cgroup.dirs):
                directory.mkdir()
            memory = cgroup.dirs["memory"]
            (memory / "memory.limit_in_bytes").write_text(str(memory_bytes))
            if (memory / "memory.memsw.limit_in_bytes").exists():  # swap too, where it is accounted
                (memory / "memory.memsw.limit_in_bytes").write_text(str(memory_bytes))
            (cgroup.dirs["pids"] / "pids.max").write_text(str(max_processes))
            if "cpu" in cgroup.dirs:
                _set_cpu_quota(cgroup.dirs["cpu"], cpu_cores)
        except OSError:
            cgroup.remove()
            raise
        return cgroup

    def remove(self) -> None:
        for directory in _distinct(self.dirs):
            for child in directory.glob("job-*"):
                with contextlib.suppress(OSError):
                    child.rmdir()
            with contextlib.suppress(OSError):
                directory.rmdir()
