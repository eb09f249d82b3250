"""A job's limits on the local backend, from its flavor, and what the launcher is told."""

from __future__ import annotations

from posttrain_launcher.bounds import PROCESSES_PER_CPU as LAUNCHER_PROCESSES_PER_CPU
from posttrain_launcher.bounds import derive_bounds
from posttrain_launcher.spec import Limits

from devstack.hf_emulator.hardware import FLAVORS
from devstack.sandbox.isolation import PROCESSES_PER_CPU, JobLimits, job_limits


def test_the_flavor_gives_its_ram_its_vcpus_and_256_processes_per_vcpu() -> None:
    limits = job_limits(FLAVORS["cpu-basic"], max_memory_bytes=1 << 40, max_processes=None)
    assert limits == JobLimits(memory_bytes=16 << 30, max_processes=512, cpu_cores=2)


def test_a_smaller_machine_caps_each() -> None:
    limits = job_limits(FLAVORS["cpu-upgrade"], max_memory_bytes=512 << 20, max_processes=64, max_cpu_cores=2)
    assert limits == JobLimits(memory_bytes=512 << 20, max_processes=64, cpu_cores=2)
    # Fewer cores, fewer processes: the launcher's rule per core.
    assert job_limits(FLAVORS["cpu-upgrade"], 1 << 40, None, max_cpu_cores=1).max_processes == 256


def test_the_launcher_is_told_the_same_bounds() -> None:
    for limits in (JobLimits(16 << 30, 512, 2), JobLimits(512 << 20, 64, 1), JobLimits(1536 << 20, 256, 1)):
        bounds = derive_bounds(limits.flavor_env(), Limits())
        assert bounds.memory_bytes == limits.memory_bytes
        assert bounds.processes == LAUNCHER_PROCESSES_PER_CPU * limits.cpu_cores


def test_the_cgroup_process_limit_never_exceeds_the_launchers() -> None:
    """Equal per-vCPU rules: the cgroup (whose hits the emulator sees and reports) trips first,
    since it also counts the launcher and the jail's own processes."""
    assert PROCESSES_PER_CPU == LAUNCHER_PROCESSES_PER_CPU
