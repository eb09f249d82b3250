"""Run a real Kubernetes control plane as local processes: etcd, kube-apiserver, kube-controller-manager.

The layout of one cluster's run dir:

    state.json          ports and pids of the running components
    pki/                CA, serving and client certificates, SA key pair
    etcd/               etcd data
    logs/<component>.log
    audit.log, audit-policy.yaml
    admin.kubeconfig    system:masters, for fixtures and the demo

Components run in their own sessions so they outlive the CLI that started them; `down` stops them
by pid and, as a safety net, any process whose command line names this run dir.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Collection
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from devstack.controlplane import components, pki
from devstack.toolchain.build import ensure_binaries, log
from devstack.toolchain.paths import run_root

READY_TIMEOUT_S = 60.0
STOP_GRACE_S = 10.0


class ClusterError(RuntimeError):
    """Something about the cluster is wrong; the message says what and what to do."""


@dataclass
class ClusterState:
    name: str
    run_dir: str
    bin_dir: str
    etcd_client_port: int
    etcd_peer_port: int
    apiserver_port: int
    pids: dict[str, int] = field(default_factory=dict)

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.apiserver_port}"

    @property
    def kubeconfig(self) -> Path:
        return Path(self.run_dir) / "admin.kubeconfig"

    @property
    def audit_log(self) -> Path:
        return Path(self.run_dir) / "audit.log"

    def kubectl(self) -> Path:
        return Path(self.bin_dir) / "kubectl"


def cluster_dir(name: str = "default") -> Path:
    return run_root() / name


def _state_path(name: str) -> Path:
    return cluster_dir(name) / "state.json"


def load_state(name: str = "default") -> ClusterState | None:
    path = _state_path(name)
    if not path.exists():
        return None
    return ClusterState(**json.loads(path.read_text()))


def _save_state(state: ClusterState) -> None:
    path = _state_path(state.name)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2))
    tmp.replace(path)


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive; reap it if it is our child.
    try:
        waited, _ = os.waitpid(pid, os.WNOHANG)
        if waited == pid:
            return False
    except ChildProcessError:
        pass
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "State:\tZ" not in status


def free_port(avoid: Collection[int] = ()) -> int:
    """A port free on 127.0.0.1 now, other than those in `avoid`: picked but not yet bound, they are
    free too, and the kernel may hand the same port out again (a process given two such ports once
    failed to bind its second)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in avoid:
            return port


def _check_port_free(port: int, what: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as exc:
            raise ClusterError(
                f"port {port} for {what} is already in use on 127.0.0.1 ({exc.strerror}); "
                "stop whatever holds it or choose another port"
            ) from exc


def component_status(state: ClusterState) -> dict[str, bool]:
    return {name: is_alive(pid) for name, pid in state.pids.items()}


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _kubeconfig(server: str, ca: Path, user: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "devstack",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": "user", "user": user}],
        "contexts": [{"name": "devstack", "context": {"cluster": "devstack", "user": "user"}}],
        "current-context": "devstack",
    }


def _client_kubeconfig(state: ClusterState, stem: str, path: Path) -> None:
    pki_dir = Path(state.run_dir) / "pki"
    user = {
        "client-certificate-data": base64.b64encode((pki_dir / f"{stem}.crt").read_bytes()).decode(),
        "client-key-data": base64.b64encode((pki_dir / f"{stem}.key").read_bytes()).decode(),
    }
    path.write_text(yaml.safe_dump(_kubeconfig(state.server, pki_dir / "ca.crt", user)))
    path.chmod(0o600)


def _start(state: ClusterState, component: str, args: list[str]) -> None:
    logs = Path(state.run_dir) / "logs"
    logs.mkdir(exist_ok=True)
    binary = Path(state.bin_dir) / component
    with open(logs / f"{component}.log", "ab") as out:
        proc = subprocess.Popen(
            [str(binary), *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            cwd=state.run_dir,
        )
    state.pids[component] = proc.pid
    _save_state(state)


def _wait(state: ClusterState, component: str, probe: Any, timeout: float = READY_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    last_error = "not ready"
    while time.monotonic() < deadline:
        if not is_alive(state.pids[component]):
            log_path = Path(state.run_dir) / "logs" / f"{component}.log"
            raise ClusterError(f"{component} exited during start-up. Last log lines:\n{_tail(log_path)}")
        try:
            if probe():
                return
        except Exception as exc:  # readiness probes fail in many ways until the component is up
            last_error = str(exc)
        time.sleep(0.2)
    raise ClusterError(f"{component} not ready after {timeout:.0f}s: {last_error}")


def _ssl_context(state: ClusterState) -> ssl.SSLContext:
    pki_dir = Path(state.run_dir) / "pki"
    ctx = ssl.create_default_context(cafile=str(pki_dir / "ca.crt"))
    ctx.load_cert_chain(str(pki_dir / "admin.crt"), str(pki_dir / "admin.key"))
    return ctx


def api_get(state: ClusterState, path: str, timeout: float = 5.0) -> Any:
    """A GET as the admin: enough for readiness checks without a client library."""
    with urllib.request.urlopen(state.server + path, context=_ssl_context(state), timeout=timeout) as resp:
        body = resp.read()
    return json.loads(body) if body.startswith(b"{") else body.decode()


def _etcd_healthy(state: ClusterState) -> bool:
    url = f"http://127.0.0.1:{state.etcd_client_port}/health"
    with urllib.request.urlopen(url, timeout=2) as resp:
        return bool(json.loads(resp.read()).get("health") == "true")


def _apiserver_ready(state: ClusterState) -> bool:
    return bool(api_get(state, "/readyz") == "ok")


def _controllers_ready(state: ClusterState) -> bool:
    # The service-account controller creating `default` proves the controller manager is working.
    api_get(state, "/api/v1/namespaces/default/serviceaccounts/default")
    return True


AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [{"level": "Metadata"}],
}


def up(
    name: str = "default",
    *,
    apiserver_port: int | None = None,
    etcd_client_port: int | None = None,
) -> ClusterState:
    """Start a cluster, or return the running one. A dead or half-started one is cleaned first."""
    existing = load_state(name)
    if existing is not None:
        status = component_status(existing)
        if status and all(status.values()):
            log(f"cluster {name!r} is already running at {existing.server}; reusing it")
            return existing
        dead = ", ".join(c for c, ok in status.items() if not ok) or "none started"
        log(f"cluster {name!r} has stale state from an earlier run (not running: {dead}); cleaning it up")
        down(name)
    elif cluster_dir(name).exists():
        log(f"removing stale run dir {cluster_dir(name)} (no state file)")
        down(name)

    for port, what in ((apiserver_port, "kube-apiserver"), (etcd_client_port, "etcd")):
        if port is not None:
            _check_port_free(port, what)
    bins = ensure_binaries()
    run_dir = cluster_dir(name)
    run_dir.mkdir(parents=True)
    client_port = etcd_client_port or free_port()
    peer_port = free_port(avoid={client_port})
    state = ClusterState(
        name=name,
        run_dir=str(run_dir),
        bin_dir=str(bins),
        etcd_client_port=client_port,
        etcd_peer_port=peer_port,
        apiserver_port=apiserver_port or free_port(avoid={client_port, peer_port}),
    )
    _save_state(state)
    started = time.monotonic()
    try:
        _up(state)
    except BaseException:
        down(name)
        raise
    log(f"cluster {name!r} ready at {state.server} in {time.monotonic() - started:.1f}s")
    return state


def _up(state: ClusterState) -> None:
    run_dir = Path(state.run_dir)
    pki_dir = run_dir / "pki"
    pki.generate(pki_dir)
    _client_kubeconfig(state, "admin", state.kubeconfig)
    _client_kubeconfig(state, "kube-controller-manager", run_dir / "kcm.kubeconfig")
    (run_dir / "audit-policy.yaml").write_text(yaml.safe_dump(AUDIT_POLICY))

    etcd_url = f"http://127.0.0.1:{state.etcd_client_port}"
    peer_url = f"http://127.0.0.1:{state.etcd_peer_port}"
    _start(state, "etcd", components.etcd_args(run_dir, etcd_url, peer_url))
    _wait(state, "etcd", lambda: _etcd_healthy(state))
    apiserver = components.apiserver_args(run_dir, etcd_url, state.apiserver_port, state.audit_log)
    _start(state, "kube-apiserver", apiserver)
    _wait(state, "kube-apiserver", lambda: _apiserver_ready(state))
    _start(state, "kube-controller-manager", components.controller_manager_args(run_dir))
    _wait(state, "kube-controller-manager", lambda: _controllers_ready(state))


def stop_apiserver(state: ClusterState) -> None:
    """Stop the kube-apiserver alone (SIGTERM, as a rolling restart stops it); etcd and the controllers
    keep running. `start_apiserver` brings it back with the same address, certificates and data."""
    stop_pids([state.pids["kube-apiserver"]])
    if is_alive(state.pids["kube-apiserver"]):
        raise ClusterError(f"kube-apiserver (pid {state.pids['kube-apiserver']}) did not stop")


def start_apiserver(state: ClusterState) -> None:
    """Start the kube-apiserver of a cluster whose apiserver was stopped; returns once it is ready."""
    run_dir = Path(state.run_dir)
    etcd_url = f"http://127.0.0.1:{state.etcd_client_port}"
    # No free-port check: the old server's closed connections may hold the port in TIME_WAIT, which
    # its listener (SO_REUSEADDR, as Go's are) binds through and a plain bind here would not.
    apiserver = components.apiserver_args(run_dir, etcd_url, state.apiserver_port, state.audit_log)
    _start(state, "kube-apiserver", apiserver)
    _wait(state, "kube-apiserver", lambda: _apiserver_ready(state))


def _processes_naming(path: Path) -> list[int]:
    """Pids of processes whose command line mentions `path`: the safety net for lost state."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            if needle in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
    return found


def stop_pids(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGTERM)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.1)
    for pid in pids:
        if is_alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline and any(is_alive(p) for p in pids):
        time.sleep(0.1)


def down(name: str = "default") -> None:
    """Stop every component and remove the run dir. Safe on a half-started or already-gone cluster."""
    run_dir = cluster_dir(name)
    state = load_state(name)
    pids = list(state.pids.values()) if state else []
    if run_dir.exists():
        pids += _processes_naming(run_dir)
    # Stop in reverse start order, so the apiserver never sees etcd vanish under a live controller.
    ordered = sorted(set(pids), key=lambda p: -pids.index(p))
    stop_pids(ordered)
    leftovers = [p for p in ordered if is_alive(p)]
    if leftovers:
        raise ClusterError(f"could not stop processes {leftovers}; kill them by hand")
    shutil.rmtree(run_dir, ignore_errors=True)


def mint_service_account_kubeconfig(
    state: ClusterState, namespace: str, service_account: str, path: Path, duration: str = "2h"
) -> Path:
    """A kubeconfig that authenticates as a ServiceAccount through a TokenRequest, for RBAC tests."""
    proc = subprocess.run(
        [
            str(state.kubectl()),
            f"--kubeconfig={state.kubeconfig}",
            "-n",
            namespace,
            "create",
            "token",
            service_account,
            f"--duration={duration}",
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if proc.returncode != 0:
        raise ClusterError(f"TokenRequest for {namespace}/{service_account} failed: {proc.stderr.strip()}")
    ca = Path(state.run_dir) / "pki" / "ca.crt"
    path.write_text(yaml.safe_dump(_kubeconfig(state.server, ca, {"token": proc.stdout.strip()})))
    path.chmod(0o600)
    return path
