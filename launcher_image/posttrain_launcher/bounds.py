"""How many processes and how much memory a job may use, from its flavor.

Every backend tells the container its flavor the way HF Jobs does: `MEMORY` (the RAM, a Kubernetes
quantity such as `16Gi`, or bytes) and `CPU_CORES`. The pods backend sets both from the container's
own limits (Downward API); the HF Jobs emulator from its hardware table. `limits.max_memory_bytes`
and `limits.max_processes` in the spec can only lower them. Without a bound from either source the
launcher refuses the job: an unbounded job could take the host down for every other job on it.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping

from .spec import Limits

MEMORY_ENV = "MEMORY"
# Set by a backend whose cgroup holds this one job alone (the pods backend's container, the emulator's
# job cgroup): only then may that cgroup's limit stand in for RLIMIT_DATA. A cgroup shared with other
# jobs (a CI container, an emulator without job cgroups) bounds them together, not this job.
MEMORY_CGROUP_ENV = "POSTTRAIN_MEMORY_CGROUP"
CPU_CORES_ENV = "CPU_CORES"
# RLIMIT_NPROC counts threads too: torch alone starts two pools of one thread per core per process.
PROCESSES_PER_CPU = 256

_SUFFIXES = {
    "": 1,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
}
_QUANTITY = re.compile(r"^([0-9]+)(|k|M|G|T|Ki|Mi|Gi|Ti)$")
_CORES = re.compile(r"^[0-9]+(\.[0-9]+)?$")


class BoundsError(ValueError):
    """No bound can be derived; the launcher refuses the job."""


@dataclasses.dataclass(frozen=True)
class Bounds:
    processes: int  # RLIMIT_NPROC of the job's uid (threads included)
    memory_bytes: int  # the job's memory: its cgroup's limit where one holds it, else RLIMIT_DATA
    # Where the memory bound is enforced: by the cgroup the launcher runs in (the whole job, what it
    # touches, not what it reserves: CUDA reserves far more address space than it uses), or, where no
    # such cgroup is visible, RLIMIT_DATA on each process.
    by_cgroup: bool = False

    @property
    def memory_rlimit(self) -> int | None:
        """RLIMIT_DATA for each job process; None when the cgroup bounds the job."""
        return None if self.by_cgroup else self.memory_bytes

    def describe(self) -> str:
        where = "its cgroup's limit" if self.by_cgroup else "RLIMIT_DATA per process (no cgroup of its own)"
        return f"memory: {self.memory_bytes} bytes, held by {where}; processes: {self.processes}"


def parse_memory(text: str) -> int:
    """`16Gi`, `8G`, `512Mi`, `17179869184` -> bytes."""
    match = _QUANTITY.match(text.strip())
    if match is None:
        raise BoundsError(f"{MEMORY_ENV}={text!r} is not a memory quantity such as 16Gi or a byte count")
    value = int(match.group(1)) * _SUFFIXES[match.group(2)]
    if value <= 0:
        raise BoundsError(f"{MEMORY_ENV}={text!r} is not a positive amount")
    return value


def parse_cores(text: str) -> int:
    """`2`, `0.5` (rounded up to whole cores) -> cores."""
    if not _CORES.match(text.strip()):
        raise BoundsError(f"{CPU_CORES_ENV}={text!r} is not a number of cores")
    cores = math.ceil(float(text))
    if cores <= 0:
        raise BoundsError(f"{CPU_CORES_ENV}={text!r} is not a positive number of cores")
    return cores


def processes_for_cores(cores: int) -> int:
    return PROCESSES_PER_CPU * cores


# cgroup v1 writes "no limit" as the largest page-aligned 63-bit count.
UNLIMITED_V1 = 1 << 62


def cgroup_memory_limit(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The memory limit of this process's own cgroup, as the kernel reads it (v2 `memory.max`, v1
    `memory.limit_in_bytes`); None when there is none, or none can be seen (no /sys in the view)."""
    try:
        with open(proc_cgroup, encoding="utf-8") as fh:
            lines = fh.read().splitlines()
    except OSError:
        return None
    found: list[int] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        relative = path.lstrip("/")
        if controllers == "":
            candidate = os.path.join(root, relative, "memory.max")
        elif "memory" in controllers.split(","):
            candidate = os.path.join(root, "memory", relative, "memory.limit_in_bytes")
        else:
            continue
        try:
            with open(candidate, encoding="utf-8") as fh:
                text = fh.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < UNLIMITED_V1:
            found.append(int(text))
    return min(found) if found else None


def derive_bounds(environ: Mapping[str, str], limits: Limits, cgroup_limit: int | None = None) -> Bounds:
    memory = [parse_memory(environ[MEMORY_ENV])] if environ.get(MEMORY_ENV) else []
    processes = (
        [processes_for_cores(parse_cores(environ[CPU_CORES_ENV]))] if environ.get(CPU_CORES_ENV) else []
    )
    if limits.max_memory_bytes is not None:
        memory.append(limits.max_memory_bytes)
    if limits.max_processes is not None:
        processes.append(limits.max_processes)
    if not memory:
        raise BoundsError(
            f"no memory bound: {MEMORY_ENV} (the flavor's RAM, set by the backend) is not set "
            "and the spec has no limits.max_memory_bytes"
        )
    if not processes:
        raise BoundsError(
            f"no process bound: {CPU_CORES_ENV} (the flavor's cores, set by the backend) is not set "
            "and the spec has no limits.max_processes"
        )
    memory_bytes = min(memory)
    # The cgroup holds the job only if it is the job's own and holds it to the bound or lower (a spec
    # may ask for less).
    own = environ.get(MEMORY_CGROUP_ENV) == "job"
    by_cgroup = own and cgroup_limit is not None and cgroup_limit <= memory_bytes
    return Bounds(processes=min(processes), memory_bytes=memory_bytes, by_cgroup=by_cgroup)
