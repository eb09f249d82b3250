"""Process and memory bounds from the flavor (`MEMORY`, `CPU_CORES`), lowered by the spec's limits."""

from __future__ import annotations

import resource
from pathlib import Path

import pytest
from posttrain_launcher import Limits, sandbox
from posttrain_launcher.bounds import (
    PROCESSES_PER_CPU,
    Bounds,
    BoundsError,
    cgroup_memory_limit,
    derive_bounds,
    parse_cores,
    parse_memory,
)


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("16Gi", 16 << 30),
        ("512Mi", 512 << 20),
        ("8G", 8 * 10**9),
        ("17179869184", 17179869184),
        ("1Ti", 1 << 40),
    ],
)
def test_memory_quantities(text: str, want: int) -> None:
    assert parse_memory(text) == want


@pytest.mark.parametrize("text", ["", "16 GB", "-1Gi", "0", "1.5Gi", "16gi", "Gi", "1e9"])
def test_bad_memory_quantities_are_refused(text: str) -> None:
    with pytest.raises(BoundsError, match="MEMORY"):
        parse_memory(text)


@pytest.mark.parametrize(("text", "want"), [("2", 2), ("0.5", 1), ("1.01", 2), ("48", 48)])
def test_cores_round_up(text: str, want: int) -> None:
    assert parse_cores(text) == want


@pytest.mark.parametrize("text", ["", "0", "two", "-2", "2 vCPU"])
def test_bad_cores_are_refused(text: str) -> None:
    with pytest.raises(BoundsError, match="CPU_CORES"):
        parse_cores(text)


def test_bounds_come_from_the_flavor() -> None:
    bounds = derive_bounds({"MEMORY": "16Gi", "CPU_CORES": "2"}, Limits())
    assert bounds == Bounds(processes=2 * PROCESSES_PER_CPU, memory_bytes=16 << 30)


def test_the_spec_can_lower_but_never_raise_them() -> None:
    env = {"MEMORY": "16Gi", "CPU_CORES": "2"}
    lower = derive_bounds(env, Limits(max_processes=64, max_memory_bytes=1 << 30))
    assert lower == Bounds(processes=64, memory_bytes=1 << 30)
    higher = derive_bounds(env, Limits(max_processes=1 << 20, max_memory_bytes=1 << 40))
    assert higher == Bounds(processes=2 * PROCESSES_PER_CPU, memory_bytes=16 << 30)


def test_the_spec_alone_is_enough() -> None:
    assert derive_bounds({}, Limits(max_processes=64, max_memory_bytes=1 << 30)) == Bounds(64, 1 << 30)


@pytest.mark.parametrize(
    ("env", "limits", "missing"),
    [
        ({}, Limits(), "no memory bound"),
        ({"CPU_CORES": "2"}, Limits(), "no memory bound"),
        ({"MEMORY": "1Gi"}, Limits(), "no process bound"),
        ({"MEMORY": "1Gi"}, Limits(max_memory_bytes=1 << 30), "no process bound"),
    ],
)
def test_without_a_bound_the_job_is_refused(env: dict[str, str], limits: Limits, missing: str) -> None:
    with pytest.raises(BoundsError, match=missing):
        derive_bounds(env, limits)


# -- the job must not start without them -----------------------------------------------------------
# The kernel call is replaced here (nothing is set on the test process); the launcher tests under
# tests/integration/launcher read the limits a real job gets.

LIMITS = {"max_file_bytes": 1 << 20, "max_open_files": 64, "max_processes": 64, "max_memory_bytes": 1 << 30}


def test_a_limit_the_kernel_refuses_stops_the_lockdown(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(which: int, limits: tuple[int, int]) -> None:
        raise PermissionError(1, "Operation not permitted")

    monkeypatch.setattr(sandbox.resource, "setrlimit", refuse)
    with pytest.raises(sandbox.SandboxError, match="cannot set resource limit"):
        sandbox.set_rlimits(**LIMITS)


def test_a_limit_left_higher_than_asked_stops_the_lockdown(monkeypatch: pytest.MonkeyPatch) -> None:
    unlimited = (resource.RLIM_INFINITY, resource.RLIM_INFINITY)
    monkeypatch.setattr(sandbox.resource, "setrlimit", lambda which, limits: None)  # silently ignored
    monkeypatch.setattr(sandbox.resource, "getrlimit", lambda which: unlimited)
    with pytest.raises(sandbox.SandboxError, match="not at most"):
        sandbox.set_rlimits(**LIMITS)


V1_FILE = "memory.limit_in_bytes"
V1_LIMIT = f"memory/{V1_FILE}"


def cgroup_view(tmp_path: Path, lines: list[str], files: dict[str, str]) -> tuple[str, str]:
    """A /proc/self/cgroup and a /sys/fs/cgroup tree as a container or a host shows them."""
    (tmp_path / "cgroup").write_text("\n".join(lines) + "\n")
    for path, text in files.items():
        (tmp_path / "sys" / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "sys" / path).write_text(text + "\n")
    return str(tmp_path / "cgroup"), str(tmp_path / "sys")


@pytest.mark.parametrize(
    ("lines", "files", "want"),
    [
        # v2 in a container (its cgroup namespace makes its cgroup the root), and on a host.
        pytest.param(["0::/"], {"memory.max": "2147483648"}, 2 << 30, id="v2-container"),
        pytest.param(
            ["0::/kubepods/pod1/c1"], {"kubepods/pod1/c1/memory.max": "1073741824"}, 1 << 30, id="v2-host"
        ),
        pytest.param(["0::/"], {"memory.max": "max"}, None, id="v2-max"),
        # v1, the memory controller alone or mounted with others; "no limit" is a huge count.
        pytest.param(["4:memory:/", "1:cpu:/"], {V1_LIMIT: "536870912"}, 512 << 20, id="v1"),
        pytest.param(["4:memory,hugetlb:/j"], {f"memory/j/{V1_FILE}": "536870912"}, 512 << 20, id="v1-co"),
        pytest.param(["4:memory:/"], {V1_LIMIT: "9223372036854771712"}, None, id="v1-unlimited"),
        # No /sys in the view (the file is missing), or no memory controller at all.
        pytest.param(["4:memory:/"], {}, None, id="no-sys"),
        pytest.param(["1:cpu:/"], {"cpu/cpu.shares": "1024"}, None, id="no-memory"),
    ],
)
def test_the_cgroup_memory_limit_is_read_where_the_kernel_shows_it(
    tmp_path: Path, lines: list[str], files: dict[str, str], want: int | None
) -> None:
    assert cgroup_memory_limit(*cgroup_view(tmp_path, lines, files)) == want


def test_a_cgroup_holding_the_job_to_its_bound_replaces_rlimit_data() -> None:
    flavor = {"MEMORY": "16Gi", "CPU_CORES": "2", "POSTTRAIN_MEMORY_CGROUP": "job"}
    held = derive_bounds(flavor, Limits(), cgroup_limit=16 << 30)
    # A cgroup the backend does not call the job's own (shared with other jobs) never stands in.
    shared = {k: v for k, v in flavor.items() if k != "POSTTRAIN_MEMORY_CGROUP"}
    assert derive_bounds(shared, Limits(), cgroup_limit=8 << 30).memory_rlimit == 16 << 30
    assert held.by_cgroup and held.memory_rlimit is None and held.memory_bytes == 16 << 30
    # No cgroup limit, or one above the bound (a spec asking for less than the flavor): RLIMIT_DATA.
    assert derive_bounds(flavor, Limits(), cgroup_limit=None).memory_rlimit == 16 << 30
    lowered = derive_bounds(flavor, Limits(max_memory_bytes=1 << 30), cgroup_limit=16 << 30)
    assert not lowered.by_cgroup and lowered.memory_rlimit == 1 << 30
    assert "cgroup" in held.describe() and "RLIMIT_DATA" in lowered.describe()
