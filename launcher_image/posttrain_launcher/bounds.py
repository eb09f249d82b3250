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
import re
from collections.abc import Mapping

from .spec import Limits

MEMORY_ENV = "MEMORY"
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
    memory_bytes: int  # RLIMIT_DATA of each job process


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


def derive_bounds(environ: Mapping[str, str], limits: Limits) -> Bounds:
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
    return Bounds(processes=min(processes), memory_bytes=min(memory))
