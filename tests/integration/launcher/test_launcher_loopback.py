"""Loopback mode: inside a network namespace holding lo alone, a job gets what torchrun, gloo, vLLM's
server and getifaddrs need, and still no way off its loopback; asked for where the namespace has
more than lo, the launcher refuses the job before any of its code runs."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from .conftest import LOOPBACK_ONLY, Launch, job_script, requires_root

pytestmark = requires_root


def test_torchrun_gloo_an_http_server_and_getifaddrs_work_on_loopback(launch: Launch) -> None:
    job = launch(job_script("loopback_stack.py"), network="loopback", wrap=LOOPBACK_ONLY, timeout=900)
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


def test_a_hostile_loopback_job_reaches_nothing_off_its_loopback(launch: Launch, canary: Canary) -> None:
    addresses = _host_addresses()
    assert addresses, "the machine has no global address to attack"
    targets = [[f"host {a}", a, canary.port] for a in addresses]
    # The host's loopback is not the job's: nothing listens on the job's own lo at that port.
    targets += [["host loopback v4", "127.0.0.1", canary.port], ["host loopback v6", "::1", canary.port]]
    job = launch(
        job_script("loopback_hostile.py", TARGETS=json.dumps(targets)),
        network="loopback",
        wrap=LOOPBACK_ONLY,
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


def test_loopback_is_refused_where_the_namespace_holds_more_than_lo(launch: Launch) -> None:
    job = launch("print('never runs')", network="loopback")
    assert job.returncode == 2 and "never runs" not in job.stdout
    assert "loopback networking was asked for, but the job's network namespace holds" in job.stderr
