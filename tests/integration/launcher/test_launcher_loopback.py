"""Loopback mode: inside a network namespace holding lo alone, a job gets what torchrun, gloo, vLLM's
server and getifaddrs need, and still no way off its loopback. The namespace is the backend's (the
emulator's jail) or the launcher's own, made where the one it was given holds more than lo: as root,
and as a job pod starts it (uid 10000, no capability); where it cannot make one, the job is refused
before any of its code runs."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from .support import AS_POD, LOOPBACK_ONLY, Launch, fill, job_script, requires_root

pytestmark = requires_root

# Who makes the job's namespace: the backend (a namespace holding lo alone, given), the launcher as
# root (a network namespace), the launcher as a pod runs it (a user and a network namespace).
NAMESPACES = {"given": LOOPBACK_ONLY, "made as root": (), "made as a pod": AS_POD}


def _pod_outputs(job_root: Path) -> None:
    """A pod's outputs are its own before the launcher starts (a launcher without root makes none)."""
    (job_root / "outputs").mkdir()
    os.chown(job_root / "outputs", 10000, 10000)


@pytest.fixture(params=sorted(NAMESPACES))
def namespace(request: pytest.FixtureRequest, job_root: Path) -> Sequence[str]:
    if request.param == "made as a pod":
        _pod_outputs(job_root)
    return NAMESPACES[request.param]


@pytest.mark.parametrize("wrap", [LOOPBACK_ONLY, AS_POD], ids=["given", "made as a pod"])
def test_torchrun_gloo_an_http_server_and_getifaddrs_work_on_loopback(
    launch: Launch, job_root: Path, wrap: Sequence[str]
) -> None:
    if wrap == AS_POD:
        _pod_outputs(job_root)
    job = launch(job_script("loopback_stack.py"), network="loopback", wrap=wrap, timeout=900)
    assert job.returncode == 0, job.stderr[-4000:]
    result = job.result()
    assert result["torchrun"] == 0 and result["sum"] == ["all-reduce sum 3.0"], job.stderr[-4000:]
    assert result["http"] == "hello from localhost"
    assert result["getifaddrs"] == ["lo"]
    assert result["env"] == {
        "POSTTRAIN_NETWORK": "loopback",
        "GLOO_SOCKET_IFNAME": "lo",
        "NCCL_SOCKET_IFNAME": "lo",
    }
    assert "posttrain-launcher: network: loopback" in job.stderr


def _host_addresses() -> list[str]:
    """The machine's own addresses, outside the job's namespace (not loopback, not link-local)."""
    out = subprocess.run(["ip", "-j", "addr"], capture_output=True, text=True, check=True).stdout
    found = []
    for link in json.loads(out):
        for info in link.get("addr_info", []):
            if info.get("scope") == "global":
                found.append(info["local"])
    return found


class Canary:
    """A TCP and a UDP listener on every address of the machine, recording anything that arrives."""

    def __init__(self) -> None:
        self.hits: list[str] = []
        self.tcp = socket.create_server(("::", 0), family=socket.AF_INET6, dualstack_ipv6=True)
        self.port = self.tcp.getsockname()[1]
        self.udp = socket.socket(socket.AF_INET6, socket.SOCK_DGRAM)
        self.udp.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        self.udp.bind(("::", self.port))
        for target in (self._accept, self._receive):
            threading.Thread(target=target, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.tcp.accept()
            except OSError:
                return
            self.hits.append(f"tcp from {peer}")
            conn.close()

    def _receive(self) -> None:
        while True:
            try:
                _, peer = self.udp.recvfrom(64)
            except OSError:
                return
            self.hits.append(f"udp from {peer}")

    def close(self) -> None:
        self.tcp.close()
        self.udp.close()


@pytest.fixture
def canary() -> Iterator[Canary]:
    found = Canary()
    yield found
    found.close()


def test_a_hostile_loopback_job_reaches_nothing_off_its_loopback(
    launch: Launch, canary: Canary, namespace: Sequence[str]
) -> None:
    addresses = _host_addresses()
    assert addresses, "the machine has no global address to attack"
    targets = [[f"host {a}", a, canary.port] for a in addresses]
    # The host's loopback is not the job's: nothing listens on the job's own lo at that port.
    targets += [["host loopback v4", "127.0.0.1", canary.port], ["host loopback v6", "::1", canary.port]]
    job = launch(
        job_script("loopback_hostile.py", TARGETS=json.dumps(targets)),
        network="loopback",
        wrap=namespace,
    )
    assert job.returncode == 0, job.stderr[-4000:]
    found: dict[str, Any] = job.result()
    assert found.pop("interfaces") == "open: ['lo']"
    # A datagram to 127.0.0.1 or ::1 is sent: on the job's own lo, where nothing listens.
    own_lo = {"udp host loopback v4", "udp host loopback v6"}
    opened = {
        name: outcome
        for name, outcome in found.items()
        if not outcome.startswith("refused") and name not in own_lo
    }
    assert opened == {}, found
    refused_by_the_filter = (
        "icmp ping socket", "icmpv6 ping socket", "raw inet", "raw inet6", "packet", "vsock", "sctp",
        "netlink audit", "unshare(CLONE_NEWUSER|CLONE_NEWNET)", "io_uring_setup",
    )  # fmt: skip
    for family in refused_by_the_filter:
        assert found[family] == "refused: EACCES", (family, found[family])
    assert found["netlink route write"] == "refused: EPERM"  # the kernel: no CAP_NET_ADMIN here
    for address in addresses:
        assert found[f"tcp host {address}"] in ("refused: ENETUNREACH", "refused: EHOSTUNREACH")
    assert found["tcp host loopback v4"] == "refused: ECONNREFUSED"
    assert canary.hits == []


def test_the_same_probe_outside_the_sandbox_does_reach_the_canary(canary: Canary) -> None:
    """The control: from the machine itself the canary answers, so the refusals above are real."""
    (address, *_) = _host_addresses()
    with socket.create_connection((address, canary.port), timeout=5):
        pass
    with socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET, socket.SOCK_DGRAM) as udp:
        udp.sendto(b"x", (address, canary.port))
    from tests.helpers import wait_for

    wait_for(lambda: len(canary.hits) >= 2, timeout=10, what="the canary to see both probes")


def test_loopback_is_refused_where_the_launcher_cannot_make_a_namespace(
    launch: Launch, job_python: str, job_root: Path
) -> None:
    """A pod whose seccomp profile refuses unshare (RuntimeDefault does): no job code runs."""
    refuse_unshare = (
        "import errno, os, sys, pyseccomp as s; f = s.SyscallFilter(s.ALLOW); "
        "f.add_rule(s.ERRNO(errno.EPERM), 'unshare'); f.load(); os.execvp(sys.argv[1], sys.argv[1:])"
    )
    _pod_outputs(job_root)
    job = launch("print('never runs')", network="loopback", wrap=(job_python, "-c", refuse_unshare, *AS_POD))
    assert job.returncode == 2 and "never runs" not in job.stdout, job.stderr
    assert "the launcher could not make one holding lo alone: unshare(0x50000000): " in job.stderr


def test_a_unix_job_gets_no_namespace_and_no_inet_socket(launch: Launch) -> None:
    """unix mode is as before: the launcher makes nothing, and the filter refuses inet sockets."""
    script = (
        "import socket\n"
        "try:\n    socket.socket(socket.AF_INET, socket.SOCK_STREAM)\nexcept OSError as exc:\n"
        "    print('inet', exc.errno)\n"
    )
    job = launch(script)
    assert job.returncode == 0, job.stderr[-4000:]
    assert job.stdout.split() == ["inet", "13"]  # EACCES
    here = ", ".join(sorted(name for _, name in socket.if_nameindex()))
    assert f"network: unix (AF_UNIX sockets only; the namespace has {here})" in job.stderr


OWN_NAME = """
import errno, json, os, socket
name = socket.gethostname()
address = socket.gethostbyname(name)
found = {"resolves": address}
try:
    socket.create_connection((name, @@PORT@@), 3).close()
    found["canary"] = "open"
except OSError as exc:
    found["canary"] = errno.errorcode.get(exc.errno or 0, str(exc))
server = socket.create_server((address, 0))
client = socket.create_connection((name, server.getsockname()[1]), 3)
conn, _ = server.accept()
client.sendall(b"hi")
found["own"] = conn.recv(2).decode()
json.dump(found, open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "result.json"), "w"))
"""


def test_the_hosts_name_is_the_jobs_own_address_on_its_loopback(
    launch: Launch, canary: Canary, job_root: Path, tmp_path: Path
) -> None:
    """As in a pod, /etc/hosts maps the host's name to an address of the machine (torchrun's workers
    connect to it): in the job's namespace that address is on its own lo, and the canary listening
    there outside sees nothing."""
    (address, *_) = (a for a in _host_addresses() if ":" not in a)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{address} {socket.gethostname()}\n")
    hosts.chmod(0o644)
    _pod_outputs(job_root)
    own_hosts = ("unshare", "--mount", "sh", "-c", f'mount --bind {hosts} /etc/hosts && exec "$@"', "sh")
    job = launch(fill(OWN_NAME, PORT=canary.port), network="loopback", wrap=(*own_hosts, *AS_POD))
    assert job.returncode == 0, job.stderr[-4000:]
    assert job.result() == {"resolves": address, "canary": "ECONNREFUSED", "own": "hi"}
    assert canary.hits == []
