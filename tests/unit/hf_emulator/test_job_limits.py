"""A job's limits on the local backend, from its flavor, and what the launcher is told."""

from __future__ import annotations

from posttrain_launcher.bounds import PROCESSES_PER_CPU as LAUNCHER_PROCESSES_PER_CPU
from posttrain_launcher.bounds import derive_bounds
from posttrain_launcher.spec import Limits

from devstack.hf_emulator.hardware import FLAVORS
from devstack.hf_emulator.isolation import PROCESSES_PER_CPU, JobLimits, job_limits


def test_the_flavor_gives_its_ram_and_256_processes_per_vcpu() -> None:
    limits = job_limits(FLAVORS["cpu-basic"], max_memory_bytes=1 << 40, max_processes=None)
    assert limits == JobLimits(memory_bytes=16 << 30, max_processes=512)


def test_a_smaller_machine_caps_both() -> None:
    limits = job_limits(FLAVORS["cpu-upgrade"], max_memory_bytes=512 << 20, max_processes=64)
    assert limits == JobLimits(memory_bytes=512 << 20, max_processes=64)


def test_the_launcher_is_told_the_same_bounds() -> None:
    for limits in (JobLimits(16 << 30, 512), JobLimits(512 << 20, 64), JobLimits(1536 << 20, 64)):
        bounds = derive_bounds(limits.flavor_env(cpu_cores=2), Limits())
        assert bounds.memory_bytes == limits.memory_bytes


def test_the_cgroup_process_limit_never_exceeds_the_launchers() -> None:
    """Equal per-vCPU rules: the cgroup (whose hits the emulator sees and reports) trips first,
    since it also counts the launcher and the jail's own processes."""
    assert PROCESSES_PER_CPU == LAUNCHER_PROCESSES_PER_CPU
