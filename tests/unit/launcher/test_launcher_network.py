"""The network decision's pure parts: which namespace grants loopback, and which addresses of the host's
name the launcher carries onto the job's own lo."""

from __future__ import annotations

import pytest
from posttrain_launcher.network import Network, NetworkRefused, decide, hostname_addresses

POD_HOSTS = """# Kubernetes-managed hosts file.
127.0.0.1\tlocalhost
::1\tlocalhost ip6-localhost ip6-loopback
fe00::0\tip6-localnet
10.244.0.7\tpt-job-0a1b2c
fd00:10:244::7\tpt-job-0a1b2c   # dual stack
fd00:10:244:0::7\tpt-job-0a1b2c  # the same address, written longer
10.244.0.7\tpt-job-0a1b2c
127.0.1.1\tpt-job-0a1b2c
not-an-address\tpt-job-0a1b2c
"""


def test_the_host_names_addresses_are_its_pod_addresses_once_and_never_loopback() -> None:
    assert hostname_addresses(POD_HOSTS, "pt-job-0a1b2c") == ["10.244.0.7", "fd00:10:244::7"]
    assert hostname_addresses(POD_HOSTS, "pt-job") == []  # whole names only
    assert hostname_addresses(POD_HOSTS, "localhost") == []
    assert hostname_addresses("", "pt-job-0a1b2c") == []


def test_loopback_is_granted_only_in_a_namespace_holding_lo_alone() -> None:
    assert decide("loopback", ("lo",), made_here=True) == Network("loopback", ("lo",), True)
    assert decide("unix", ("eth0", "lo")).mode == "unix"
    with pytest.raises(NetworkRefused, match="holds eth0, lo, not lo alone"):
        decide("loopback", ("eth0", "lo"))


def test_the_mode_and_who_made_the_namespace_are_reported() -> None:
    made = Network("loopback", ("lo",), made_here=True)
    assert made.report() == {"mode": "loopback", "namespace": "launcher"}
    assert "the launcher made the job's network namespace, lo alone" in made.describe()
    assert Network("loopback", ("lo",)).report() == {"mode": "loopback", "namespace": "backend"}
    assert Network("unix", ("eth0", "lo")).describe().startswith("network: unix (AF_UNIX sockets only;")
