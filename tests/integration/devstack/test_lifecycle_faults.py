"""Starting, stopping and breaking devstack clusters: every fault gives a clear message, never a hang.

Each test runs its own small cluster under a temporary run root, so it cannot disturb the session's.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from devstack.controlplane import cluster as devcluster
from devstack.toolchain import build
from tests.helpers import wait_for


@pytest.fixture
def run_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    root = tmp_path / "run"
    monkeypatch.setenv("DEVSTACK_RUN_DIR", str(root))
    yield root
    for state_file in root.glob("*/state.json"):
        devcluster.down(state_file.parent.name)


def _cli(*args: str, run_root: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, DEVSTACK_RUN_DIR=str(run_root))
    return subprocess.run(
        [sys.executable, "-m", "devstack", *args], capture_output=True, text=True, env=env, timeout=120
    )


def _nothing_listens_on(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) != 0


def test_down_leaves_no_process_port_or_directory(run_root: Path) -> None:
    state = devcluster.up("lifecycle")
    pids = list(state.pids.values())
    ports = [state.apiserver_port, state.etcd_client_port, state.etcd_peer_port]
    assert all(devcluster.component_status(state).values())

    result = _cli("cluster", "down", "--name", "lifecycle", run_root=run_root)

    assert result.returncode == 0, result.stderr
    assert not any(devcluster.is_alive(pid) for pid in pids)
    assert all(_nothing_listens_on(p) for p in ports)
    assert not (run_root / "lifecycle").exists()
    # A second down on a cluster that is gone is a no-op, not an error.
    assert _cli("cluster", "down", "--name", "lifecycle", run_root=run_root).returncode == 0


def test_second_up_reuses_the_running_cluster(run_root: Path) -> None:
    first = devcluster.up("twice")
    second = devcluster.up("twice")
    assert second.pids == first.pids
    assert second.apiserver_port == first.apiserver_port


def test_port_in_use_is_refused_clearly_and_leaves_nothing(run_root: Path) -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        result = _cli("cluster", "up", "--name", "busy", "--apiserver-port", str(port), run_root=run_root)
    assert result.returncode == 1
    assert f"port {port} for kube-apiserver is already in use" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (run_root / "busy").exists()


def test_stale_run_dir_is_cleaned_and_replaced(run_root: Path) -> None:
    stale = run_root / "stale"
    (stale / "etcd" / "member").mkdir(parents=True)
    (stale / "etcd" / "member" / "junk").write_text("left by a crashed run")
    state = devcluster.up("stale")
    assert all(devcluster.component_status(state).values())
    assert not (stale / "etcd" / "member" / "junk").exists()


def test_state_with_dead_processes_is_reported_then_replaced(run_root: Path) -> None:
    state = devcluster.up("dead")
    for pid in state.pids.values():
        os.killpg(pid, signal.SIGKILL)
    wait_for(lambda: not any(devcluster.component_status(state).values()), what="components to die")

    status = _cli("cluster", "status", "--name", "dead", run_root=run_root)
    assert status.returncode == 1 and "NOT RUNNING" in status.stdout

    fresh = devcluster.up("dead")
    assert fresh.pids != state.pids
    assert all(devcluster.component_status(fresh).values())


def test_etcd_killed_underneath_is_visible_and_down_still_cleans(run_root: Path) -> None:
    state = devcluster.up("etcdkill")
    os.killpg(state.pids["etcd"], signal.SIGKILL)
    wait_for(lambda: not devcluster.component_status(state)["etcd"], what="etcd to die")

    status = _cli("cluster", "status", "--name", "etcdkill", run_root=run_root)
    assert status.returncode == 1
    assert "etcd" in status.stdout and "NOT RUNNING" in status.stdout
    # The apiserver answers not-ready (or times out): never a hang.
    with pytest.raises((urllib.error.URLError, TimeoutError)):
        devcluster.api_get(state, "/readyz?verbose", timeout=5)

    assert _cli("cluster", "down", "--name", "etcdkill", run_root=run_root).returncode == 0
    assert not any(devcluster.is_alive(pid) for pid in state.pids.values())


def test_unreachable_go_proxy_fails_a_cold_build_with_a_clear_message(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.setenv("GOMODCACHE", str(tmp_path / "gomodcache"))  # cold: nothing cached
    monkeypatch.setenv("GOPROXY", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("GOSUMDB", "off")
    with pytest.raises(build.BuildError, match="Go module proxy is unreachable"):
        build.build_etcd(tmp_path / f"out-{uuid.uuid4().hex[:6]}")
