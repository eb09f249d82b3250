"""What a job may do on the network.

- `unix` (every backend): no socket but AF_UNIX. Nothing can leave the job, whatever its network.
- `loopback` (where the backend gives each job a network namespace holding `lo` alone): TCP and UDP
  sockets too, and route-netlink reads (getifaddrs), for what torch.distributed, NCCL's bootstrap,
  vLLM and TRL open on 127.0.0.1. The namespace is the guarantee: with no interface but `lo` there is
  no route off the box, and the job cannot add one (no capability in that namespace, and the filter
  refuses every new namespace). The filter still refuses raw and packet sockets, ICMP, SCTP, other
  families and netlink other than route, as a second layer.

The operator asks for a mode in the job spec; the launcher checks the namespace before any job code
and refuses a `loopback` job whose namespace holds anything but `lo` (the platform's settings were
wrong, and the job must not run with a path out).
"""

from __future__ import annotations

import dataclasses
import socket
from typing import Literal

Mode = Literal["unix", "loopback"]


class NetworkRefused(Exception):
    """The job asked for a mode this network namespace cannot guarantee."""


@dataclasses.dataclass(frozen=True)
class Network:
    mode: Mode
    interfaces: tuple[str, ...]

    def describe(self) -> str:
        if self.mode == "loopback":
            return "network: loopback (TCP/UDP on lo only; the job's network namespace holds lo alone)"
        return f"network: unix (AF_UNIX sockets only; the namespace has {', '.join(self.interfaces)})"


def interfaces() -> tuple[str, ...]:
    """The interfaces of this process's network namespace."""
    return tuple(sorted(name for _, name in socket.if_nameindex()))


def decide(requested: Mode, found: tuple[str, ...]) -> Network:
    if requested == "loopback" and found != ("lo",):
        raise NetworkRefused(
            "loopback networking was asked for, but the job's network namespace holds "
            f"{', '.join(found) or 'no interface'}, not lo alone: a path off the box could be open"
        )
    return Network(requested, found)
