"""The egress check's pure parts: which probes a pod derives, and the rounds until all are closed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from posttrain_launcher.egress import EgressConfigError, Probe, check, default_gateway, probes_for

RESOLV = "search ns.svc.cluster.local svc.cluster.local\nnameserver 10.96.0.10\noptions ndots:5\n"
ROUTE = (
    "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n"
    "eth0\t00000000\t0100F40A\t0003\t0\t0\t0\t00000000\n"
    "eth0\t0000F40A\t00000000\t0001\t0\t0\t0\t00FFFFFF\n"
)


def test_default_gateway_is_read_from_the_route_table() -> None:
    assert default_gateway(ROUTE) == "10.244.0.1"
    assert default_gateway("Iface\tDestination\tGateway\n") is None


def test_probes_are_the_operators_plus_what_the_pod_sees() -> None:
    env = {
        "POSTTRAIN_EGRESS_PROBES": '[{"name": "gateway", "host": "10.96.0.20", "port": 80}]',
        "KUBERNETES_SERVICE_HOST": "10.96.0.1",
        "KUBERNETES_SERVICE_PORT": "443",
        "POSTTRAIN_NODE_IP": "172.18.0.2",
    }
    probes = probes_for(env, RESOLV, ROUTE)
    assert [str(p) for p in probes] == [
        "gateway (tcp 10.96.0.20:80)",
        "kubernetes-api-service (tcp 10.96.0.1:443)",
        "cluster-dns (dns 10.96.0.10:53)",
        "cluster-dns (tcp 10.96.0.10:53)",
        "node (tcp 10.244.0.1:10250)",
        "node (tcp 10.244.0.1:6443)",
        "node (tcp 172.18.0.2:10250)",
        "node (tcp 172.18.0.2:6443)",
    ]


@pytest.mark.parametrize(
    "raw", ["{}", "not json", '[{"name": "x"}]', '[{"name": "x", "host": "h", "port": "p"}]']
)
def test_a_malformed_probe_list_is_an_error(raw: str) -> None:
    with pytest.raises(EgressConfigError):
        probes_for({"POSTTRAIN_EGRESS_PROBES": raw}, "", "")


class FakeTime:
    def __init__(self) -> None:
        self.now = 0.0

    def clock(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_rounds_repeat_until_the_policy_closes_everything() -> None:
    time = FakeTime()
    probes = [Probe("api", "10.96.0.1", 443), Probe("dns", "10.96.0.10", 53, "dns")]
    # The policy is programmed at t=1.2: before that, the API answers.
    outcome = check(
        probes, 20, probe=lambda p: p.name == "api" and time.now < 1.2, clock=time.clock, sleep=time.sleep
    )
    assert outcome.verified and outcome.rounds == 4 and outcome.probes == 2


def test_an_address_open_past_the_bound_fails_with_its_name() -> None:
    time = FakeTime()
    probes = [Probe("api", "10.96.0.1", 443), Probe("canary", "172.18.0.1", 8080)]
    outcome = check(probes, 3, probe=lambda p: p.name == "canary", clock=time.clock, sleep=time.sleep)
    assert not outcome.verified
    assert outcome.open == ("canary (tcp 172.18.0.1:8080)",)
    assert outcome.seconds <= 3


def test_the_report_carries_the_jobs_network_once_it_is_set_up(tmp_path: Path) -> None:
    from posttrain_launcher.egress import Outcome, write_report

    report = tmp_path / "termination-log"
    outcome = Outcome(open=(), probes=9, rounds=2, seconds=1.234)
    network = {"mode": "loopback", "namespace": "launcher"}
    write_report({"POSTTRAIN_EGRESS_REPORT": str(report)}, outcome, network)
    assert json.loads(report.read_text()) == {
        "egressVerified": True,
        "reason": "",
        "probes": 9,
        "rounds": 2,
        "seconds": 1.23,
        "open": [],
        "kernel": f"{os.uname().release} {os.uname().version}",
        "network": network,
    }
    write_report({"POSTTRAIN_EGRESS_REPORT": str(report)}, outcome, None)  # refused: no job network
    assert "network" not in json.loads(report.read_text())
    write_report({}, outcome, None)  # no report asked for: nothing written, no error
