"""What the local backend gives each job: its limits, its cgroup, and the file system view it sees.

A job's view holds its own job tree (volumes and work dir), the host's `/usr` (and the `/bin`, `/lib`
links into it), the job interpreter with the libraries on its `sys.path`, and of a source checkout
only the packages the launcher image holds. Nothing else of the host: no temporary directory, no
other job's tree, no repo store, no home directory. `jail.py` builds it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import subprocess
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from devstack.sandbox.cgroups import CgroupError, CgroupRoot, JobCgroup
from devstack.sandbox.jail import Bind, JailSpec

log = logging.getLogger(__name__)


class Flavor(Protocol):
    """What a job's limits are made from: an HF flavor (`hf_emulator/hardware.py`) is one."""

    @property
    def ram(self) -> str: ...  # "<n> GB"

    @property
    def cpu_cores(self) -> int: ...


JAIL_SCRIPT = str(Path(__file__).with_name("jail.py"))
JOB_UID = 10000  # the launcher drops to this uid; a job's writable dirs must belong to it
# What the launcher image adds to its Python besides the libraries (launcher_image/Dockerfile).
IMAGE_PACKAGES = ("posttrain_launcher", "graders")
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_BINDS = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d")
ETC_FILES = {
    "/etc/passwd": (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"job:x:{JOB_UID}:{JOB_UID}:job:/tmp:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "/etc/group": f"root:x:0:\njob:x:{JOB_UID}:\nnogroup:x:65534:\n",
    # As container runtimes write it: the job's own hostname names its loopback (torch.distributed
    # and gloo look it up).
    "/etc/hosts": "127.0.0.1\tlocalhost job\n::1\tlocalhost job\n",
    "/etc/hostname": "job\n",
    "/etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
    "/etc/resolv.conf": "",
}
# Like HF Jobs, a job's processes and threads are bounded per vCPU; equal to the launcher's
# RLIMIT_NPROC rule, so the cgroup (whose hits the emulator sees) trips first.
PROCESSES_PER_CPU = 256
CGROUP_MEMORY_VIEW = "/sys/fs/cgroup/memory"

# Besides the path and prefixes: the packages of the installed task plugins (entry points of group
# posttrain.tasks), which a lab's launcher image carries installed, and a checkout may hold editable.
_PROBE = (
    "import json, os, sys\n"
    "from importlib import metadata\n"
    "prefixes = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}\n"
    "entries = metadata.entry_points(group='posttrain.tasks')\n"
    "plugins = sorted({e.value.split(':')[0].split('.')[0] for e in entries})\n"
    "print(json.dumps({'path': sys.path, 'prefixes': sorted(os.path.realpath(p) for p in prefixes),"
    " 'plugins': plugins}))\n"
)


@dataclasses.dataclass(frozen=True)
class JobLimits:
    memory_bytes: int
    max_processes: int
    cpu_cores: int

    def flavor_env(self) -> dict[str, str]:
        """What HF Jobs tells the container (`MEMORY`, `CPU_CORES`): the launcher's bounds."""
        mib = self.memory_bytes >> 20
        memory = f"{mib >> 10}Gi" if mib % 1024 == 0 else f"{mib}Mi"
        return {"MEMORY": memory, "CPU_CORES": str(self.cpu_cores)}


def job_limits(
    flavor: Flavor, max_memory_bytes: int, max_processes: int | None, max_cpu_cores: int | None = None
) -> JobLimits:
    """The flavor's RAM (its "GB" are GiB, as HF Jobs' `MEMORY` says), its vCPUs and 256 processes
    per vCPU, each capped for a machine smaller than the flavor."""
    ram = int(flavor.ram.split()[0]) << 30
    cores = min(flavor.cpu_cores, max_cpu_cores or flavor.cpu_cores)
    processes = PROCESSES_PER_CPU * cores
    if max_processes is not None:
        processes = min(processes, max_processes)
    return JobLimits(min(ram, max_memory_bytes), processes, cores)


def host_memory_bytes() -> int:
    return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def host_cpu_cores() -> int:
    return len(os.sched_getaffinity(0))


def _under(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def python_binds(interpreter: str) -> list[Bind]:
    """Read-only binds that make `interpreter` work as it does on the host, and no more.

    The interpreter's own prefixes (a venv and its base) and every site-packages dir on its path are
    bound whole; from any other directory on its path (a source checkout) only IMAGE_PACKAGES and the
    packages of installed task plugins. The
    probe runs isolated (`-I`): a job's PYTHONPATH, which a client chooses, never widens the view,
    and no code of its choosing runs on the host.
    """
    out = subprocess.run(
        [interpreter, "-I", "-c", _PROBE],
        env={"PATH": "/usr/bin:/bin"},
        cwd="/",
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    info = json.loads(out.stdout)
    covered = ["/usr"]
    sources: list[str] = []
    for prefix in info["prefixes"]:
        if not _under(prefix, covered):
            sources.append(prefix)
            covered.append(prefix)
    for entry in info["path"]:
        real = os.path.realpath(entry) if entry else ""
        if not real or not os.path.isdir(real) or _under(real, covered):
            continue
        if os.path.basename(real) in ("site-packages", "dist-packages"):
            sources.append(real)
            covered.append(real)
            continue
        for package in (*IMAGE_PACKAGES, *info["plugins"]):
            candidate = os.path.join(real, package)
            if os.path.isdir(candidate) and not _under(candidate, covered):
                sources.append(candidate)
                covered.append(candidate)
    return [Bind(source, source) for source in sources]


class Isolation:
    """Per-emulator: the cgroup parent (if the host allows one) and the view of each interpreter."""

    def __init__(
        self,
        *,
        max_job_memory_bytes: int | None,
        max_job_processes: int | None,
        max_job_cpu_cores: int | None,
    ) -> None:
        self.max_job_memory_bytes = max_job_memory_bytes or host_memory_bytes()
        self.max_job_processes = max_job_processes
        self.max_job_cpu_cores = max_job_cpu_cores or host_cpu_cores()
        self.cgroups: CgroupRoot | None = None
        self.cgroup_problem: str | None = None
        try:
            self.cgroups = CgroupRoot.create()
        except CgroupError as exc:
            self.cgroup_problem = str(exc)
            log.warning("jobs run without a cgroup of their own (no memory or pids limit per job): %s", exc)
        self._lock = threading.Lock()
        self._python: dict[str, list[Bind]] = {}

    def limits(self, flavor: Flavor) -> JobLimits:
        return job_limits(flavor, self.max_job_memory_bytes, self.max_job_processes, self.max_job_cpu_cores)

    def job_cgroup(self, job_id: str, limits: JobLimits) -> JobCgroup | None:
        if self.cgroups is None:
            return None
        return self.cgroups.job(job_id, limits.memory_bytes, limits.max_processes, limits.cpu_cores)

    def _python_binds(self, interpreter: str) -> list[Bind]:
        with self._lock:
            if interpreter not in self._python:
                self._python[interpreter] = python_binds(interpreter)
            return self._python[interpreter]

    def jail_spec(
        self,
        *,
        argv: list[str],
        env: Mapping[str, str],
        cwd: Path,
        job_dir: Path,
        writable: list[Path],
        read_only: list[Path],
        limits: JobLimits,
        cgroup: JobCgroup | None,
    ) -> JailSpec:
        """`writable` and `read_only`: paths of the job's tree, bound at the same paths (so its
        POSTTRAIN_ROOT and HOME mean the same inside); read-only ones over writable parents."""
        binds: list[Bind] = []
        symlinks: dict[str, str] = {}
        for path in SYSTEM_DIRS:
            if os.path.islink(path):
                symlinks[path] = os.readlink(path)
            elif os.path.isdir(path):
                binds.append(Bind(path, path))
        binds += [Bind(path, path) for path in ETC_BINDS if os.path.exists(path)]
        binds += self._python_binds(argv[0])
        binds += [Bind(str(p), str(p), read_only=False) for p in writable]
        binds += [Bind(str(p), str(p)) for p in read_only]
        if cgroup is not None:
            # Read-only, as a container runtime shows a container its cgroup (the jail's cgroup
            # namespace makes it the root): the launcher sees the memory limit that holds the job,
            # and is told the cgroup is the job's own.
            binds.append(Bind(str(cgroup.dirs["memory"]), CGROUP_MEMORY_VIEW))
            env = {**env, "POSTTRAIN_MEMORY_CGROUP": "job"}
        view = job_dir / "view"
        view.mkdir(mode=0o700, exist_ok=True)
        return JailSpec(
            argv=argv,
            env=dict(env),
            cwd=str(cwd),
            new_root=str(view),
            binds=binds,
            symlinks=symlinks,
            files=ETC_FILES,
            cgroup_procs=cgroup.procs_files() if cgroup is not None else [],
            tmp_bytes=limits.memory_bytes,
            job_uid=JOB_UID,
        )

    def close(self) -> None:
        if self.cgroups is not None:
            self.cgroups.remove()


def isolation_for(
    execute: bool,
    isolate: bool | None,
    max_memory_bytes: int | None,
    max_processes: int | None,
    max_cpu_cores: int | None,
) -> Isolation | None:
    """Jobs isolated (namespaces, a cgroup each) when asked, by default when running as root."""
    if isolate is None:
        isolate = execute and os.geteuid() == 0
    if not isolate and execute:
        why = "isolate=False" if os.geteuid() == 0 else "the emulator is not running as root"
        log.warning("jobs are not isolated from each other or from the host: %s", why)
    if not isolate:
        return None
    return Isolation(
        max_job_memory_bytes=max_memory_bytes,
        max_job_processes=max_processes,
        max_job_cpu_cores=max_cpu_cores,
    )
