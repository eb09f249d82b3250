"""Egress verified from inside the job's own pod, before any job code runs, failing closed.

A default-deny NetworkPolicy is programmed by the node's network plugin some time after the API
server stores it, and on several plugins a new pod can open connections before its policy is in
place. So the launcher of a pods-backend job probes what the job must never reach: the addresses
the operator lists in POSTTRAIN_EGRESS_PROBES (the API server's endpoint, the gateway, the operator's
broker, a canary), and what the pod itself can see: the API server's Service (the kubelet always
sets KUBERNETES_SERVICE_HOST), the cluster DNS servers of /etc/resolv.conf (a query over UDP and a
TCP connect), and its node (the default route's gateway and
POSTTRAIN_NODE_IP). A probe is open when a TCP handshake completes or a DNS answer arrives; refused,
reset, unreachable and timed out all count as closed. The probes are repeated until every one is
closed, for at most the bound; if any stays open the job is not started (exit 4).
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import struct
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Literal

PROBES_ENV = "POSTTRAIN_EGRESS_PROBES"
BOUND_ENV = "POSTTRAIN_EGRESS_BOUND_SECONDS"
NODE_IP_ENV = "POSTTRAIN_NODE_IP"
REPORT_ENV = "POSTTRAIN_EGRESS_REPORT"  # a file the outcome is written to (the pod's termination message)
EXIT_EGRESS_OPEN = 4  # the pod's network reaches something it must not; no job code ran

DEFAULT_BOUND_SECONDS = 20.0
PROBE_TIMEOUT_SECONDS = 1.0
RETRY_PAUSE_SECONDS = 0.5
MAX_PROBES = 64
# Ports on the node: the kubelet, and the API server where it runs on the node (kind, kubeadm).
NODE_PORTS = (10250, 6443)
DNS_QUERY_NAME = "kubernetes.default.svc.cluster.local"

Kind = Literal["tcp", "dns"]


class EgressConfigError(ValueError):
    """POSTTRAIN_EGRESS_PROBES is malformed: the check cannot be trusted, so the job is refused."""


@dataclass(frozen=True)
class Probe:
    name: str
    host: str
    port: int
    kind: Kind = "tcp"

    def __str__(self) -> str:
        return f"{self.name} ({self.kind} {self.host}:{self.port})"


@dataclass(frozen=True)
class Outcome:
    open: tuple[str, ...]  # probes still open when the bound ran out; empty: verified
    probes: int
    rounds: int
    seconds: float

    @property
    def verified(self) -> bool:
        return not self.open

    def report(self) -> dict[str, object]:
        return {
            "egressVerified": self.verified,
            "reason": "" if self.verified else open_reason(self),
            "probes": self.probes,
            "rounds": self.rounds,
            "seconds": round(self.seconds, 2),
            "open": list(self.open),
        }


def enabled(environ: Mapping[str, str]) -> bool:
    return PROBES_ENV in environ


def _given(environ: Mapping[str, str]) -> list[Probe]:
    try:
        raw = json.loads(environ[PROBES_ENV])
        if not isinstance(raw, list) or len(raw) > MAX_PROBES:
            raise EgressConfigError(f"{PROBES_ENV} must be a list of at most {MAX_PROBES} probes")
        return [
            Probe(str(p["name"]), str(p["host"]), int(p.get("port", 0)), p.get("kind", "tcp"))
            for p in raw
            if p.get("kind", "tcp") in ("tcp", "dns")
        ]
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise EgressConfigError(f"{PROBES_ENV} is not a valid probe list: {exc}") from None


def nameservers(resolv_conf: str) -> list[str]:
    servers = []
    for line in resolv_conf.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "nameserver":
            servers.append(parts[1])
    return servers


def default_gateway(route_table: str) -> str | None:
    """The IPv4 default route's gateway from /proc/net/route (little-endian hex)."""
    for line in route_table.splitlines()[1:]:
        fields = line.split()
        if len(fields) >= 3 and fields[1] == "00000000" and fields[2] != "00000000":
            return socket.inet_ntoa(struct.pack("<I", int(fields[2], 16)))
    return None


def read_or_empty(path: str) -> str:
    """A small system file's text ("" where it cannot be read)."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            return fh.read()
    except OSError:
        return ""


def probes_for(environ: Mapping[str, str], resolv_conf: str, route_table: str) -> list[Probe]:
    """The operator's list plus what this pod can find out about its own surroundings."""
    probes = _given(environ)
    api_host, api_port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    if api_host:
        probes.append(Probe("kubernetes-api-service", api_host, int(api_port or 443)))
    for server in nameservers(resolv_conf):
        probes.append(Probe("cluster-dns", server, 53, "dns"))
        probes.append(Probe("cluster-dns", server, 53))
    nodes = {ip for ip in (default_gateway(route_table), environ.get(NODE_IP_ENV)) if ip}
    for ip in sorted(nodes):
        probes += [Probe("node", ip, port) for port in NODE_PORTS]
    unique = list(dict.fromkeys(probes))
    return unique[:MAX_PROBES]


def _dns_query(name: str) -> bytes:
    header = struct.pack(">HHHHHH", secrets.randbits(16), 0x0100, 1, 0, 0, 0)
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return header + labels + struct.pack(">HH", 1, 1)


def is_open(probe: Probe, timeout: float = PROBE_TIMEOUT_SECONDS) -> bool:
    """True if the network let this probe through (an answer of any kind came back)."""
    try:
        if probe.kind == "tcp":
            with socket.create_connection((probe.host, probe.port), timeout=timeout):
                return True
        family = socket.AF_INET6 if ":" in probe.host else socket.AF_INET
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.settimeout(timeout)
            sock.connect((probe.host, probe.port))
            sock.send(_dns_query(DNS_QUERY_NAME))
            return bool(sock.recv(512))
    except OSError:
        return False


def check(
    probes: Sequence[Probe],
    bound_seconds: float,
    *,
    probe: Callable[[Probe], bool] = is_open,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Probe everything in parallel, round after round, until a round finds all closed or the
    bound is spent. An open probe may be the policy not yet programmed: hence the rounds."""
    started = clock()
    rounds = 0
    with ThreadPoolExecutor(max_workers=max(1, min(len(probes), 16))) as pool:
        while True:
            rounds += 1
            still_open = tuple(str(p) for p, op in zip(probes, pool.map(probe, probes), strict=True) if op)
            elapsed = clock() - started
            if not still_open or elapsed + RETRY_PAUSE_SECONDS > bound_seconds:
                return Outcome(still_open, len(probes), rounds, elapsed)
            sleep(RETRY_PAUSE_SECONDS)


def bound(environ: Mapping[str, str]) -> float:
    try:
        value = float(environ.get(BOUND_ENV, DEFAULT_BOUND_SECONDS))
    except ValueError:
        raise EgressConfigError(f"{BOUND_ENV} is not a number") from None
    if not 0 < value <= 300:
        raise EgressConfigError(f"{BOUND_ENV} must be within (0, 300] seconds")
    return value


def verify(environ: Mapping[str, str]) -> Outcome:
    """The check as the launcher runs it in a pod. Raises EgressConfigError on a bad probe list."""
    probes = probes_for(environ, read_or_empty("/etc/resolv.conf"), read_or_empty("/proc/net/route"))
    return check(probes, bound(environ))


def write_report(environ: Mapping[str, str], outcome: Outcome, network: Mapping[str, object] | None) -> None:
    """The outcome, and the job's network once the launcher has set it up (None: no job code ran)."""
    path = environ.get(REPORT_ENV)
    if not path:
        return
    report = outcome.report()
    # Which kernel the job runs on, as the launcher saw it before any job code: gVisor reports its own.
    uname = os.uname()
    report["kernel"] = f"{uname.release} {uname.version}"
    if network is not None:
        report["network"] = dict(network)
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(report, fh)
    except OSError:
        pass  # the report is for users; the exit code is what the operator acts on


def open_reason(outcome: Outcome) -> str:
    return f"egress open to {', '.join(outcome.open)}; no job code ran"


__all__ = [
    "EXIT_EGRESS_OPEN",
    "EgressConfigError",
    "Outcome",
    "Probe",
    "check",
    "enabled",
    "open_reason",
    "probes_for",
    "verify",
    "write_report",
]
