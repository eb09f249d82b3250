"""What a job may do on the network.

- `unix` (every backend): no socket but AF_UNIX. Nothing can leave the job, whatever its network.
- `loopback`: TCP and UDP sockets too, and route-netlink reads (getifaddrs), for what
  torch.distributed, NCCL's bootstrap, vLLM and TRL open on 127.0.0.1, in a network namespace holding
  `lo` alone. The namespace is the guarantee: with no interface but `lo` there is no route off the
  box, and the job cannot add one (no capability in that namespace, and the filter refuses every new
  namespace). The filter still refuses raw and packet sockets, ICMP, SCTP, other families and netlink
  other than route, as a second layer.

The operator asks for a mode in the job spec. Where the launcher's namespace holds more than `lo`
(a pod's, after its egress check), it makes a new one for itself and the job: a network namespace
as root, a user and network namespace otherwise (the pod's seccomp profile must allow exactly that
`unshare`), brings `lo` up, and keeps no capability in it. If that fails, or the result holds
anything but `lo`, the job is refused before any of its code runs: it must not run with a path out.
"""

from __future__ import annotations

import ctypes
import dataclasses
import fcntl
import os
import socket
import struct
import time
from typing import Literal

from .egress import read_or_empty
from .sandbox import NETLINK_ROUTE, set_dumpable

Mode = Literal["unix", "loopback"]


class NetworkRefused(Exception):
    """The job asked for a mode this network namespace cannot guarantee."""


CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1
_CAPABILITY_VERSION_3 = 0x20080522
_IPV6_LOOPBACK = bytes(15) + b"\x01"
_NLMSG_ERROR = 2  # the kernel's acknowledgement (error 0) or refusal
_RTM_NEWADDR = 20
_IFA_ADDRESS, _IFA_LOCAL = 1, 2
_NLM_F_REQUEST, _NLM_F_ACK, _NLM_F_EXCL, _NLM_F_CREATE = 0x1, 0x4, 0x200, 0x400

_libc = ctypes.CDLL(None, use_errno=True)


@dataclasses.dataclass(frozen=True)
class Network:
    mode: Mode
    interfaces: tuple[str, ...]
    made_here: bool = False  # the launcher made the namespace (else the backend gave it)

    def describe(self) -> str:
        if self.mode == "unix":
            return f"network: unix (AF_UNIX sockets only; the namespace has {', '.join(self.interfaces)})"
        who = "the launcher made" if self.made_here else "the backend gave"
        return f"network: loopback (TCP/UDP on lo only; {who} the job's network namespace, lo alone)"

    def report(self) -> dict[str, object]:
        return {"mode": self.mode, "namespace": "launcher" if self.made_here else "backend"}


def interfaces() -> tuple[str, ...]:
    """The interfaces of this process's network namespace."""
    return tuple(sorted(name for _, name in socket.if_nameindex()))


def decide(requested: Mode, found: tuple[str, ...], made_here: bool = False) -> Network:
    """`found`: the namespace's interfaces; in one the launcher made, those that are up (a kernel with
    tunnel modules loaded gives every new namespace down fallback devices, `tunl0`, `sit0`, which
    carry nothing and which the job, holding no capability, cannot bring up)."""
    if requested == "loopback" and found != ("lo",):
        raise NetworkRefused(
            "loopback networking was asked for, but the job's network namespace holds "
            f"{', '.join(found) or 'no interface'}, not lo alone: a path off the box could be open"
        )
    return Network(requested, found, made_here)


def establish(requested: Mode) -> Network:
    """The job's network, making a namespace holding lo alone where loopback needs one. Call it
    while the process has one thread (the kernel refuses a new user namespace otherwise)."""
    found = interfaces()
    if requested != "loopback" or found == ("lo",):
        return decide(requested, found)
    try:
        enter_own_namespace()
        live = tuple(name for name in interfaces() if name == "lo" or _is_up(name))
    except OSError as exc:
        raise NetworkRefused(
            f"loopback networking was asked for; this namespace holds {', '.join(found)} and the "
            f"launcher could not make one holding lo alone: {exc.strerror or exc}"
        ) from None
    return decide(requested, live, made_here=True)


def _wait_for_one_thread(bound_seconds: float = 2.0) -> None:
    """A thread just joined (the egress check's) may still be counted for a moment, and the kernel
    refuses a new user namespace to a process with more than one thread (EINVAL)."""
    deadline = time.monotonic() + bound_seconds
    while len(os.listdir("/proc/self/task")) > 1 and time.monotonic() < deadline:
        time.sleep(0.001)


def enter_own_namespace() -> None:
    """Move this process into a new network namespace (and, without root, a new user namespace
    mapping only its own ids), bring lo up with the addresses this host's name had outside, then give
    up every capability it held there.

    The name matters: torchrun's rendezvous, accelerate and vLLM connect to the host's name, which
    /etc/hosts maps to the pod's address. On lo, that address is the job's own; nothing else is."""
    uid, gid = os.geteuid(), os.getegid()
    own = hostname_addresses(read_or_empty("/etc/hosts"), socket.gethostname())
    if uid == 0:
        _unshare(CLONE_NEWNET)
    else:
        _wait_for_one_thread()
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)
        # A non-dumpable process's /proc files belong to root, which this namespace does not map:
        # dumpable for the three writes (no job code runs yet), then not again.
        set_dumpable(True)
        try:
            maps = (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1"))
            for name, text in maps:
                with open(f"/proc/self/{name}", "w", encoding="ascii") as fh:
                    fh.write(text)
        finally:
            set_dumpable(False)
    _bring_up("lo")
    for address in own:
        _add_address("lo", address)
    if uid != 0:
        _drop_capabilities()


def hostname_addresses(hosts: str, hostname: str) -> list[str]:
    """The addresses /etc/hosts gives `hostname`, loopback ones left out (lo has them already)."""
    found: dict[bytes, str] = {}
    for line in hosts.splitlines():
        fields = line.split("#", 1)[0].split()
        if len(fields) < 2 or hostname not in fields[1:]:
            continue
        try:
            family = socket.AF_INET6 if ":" in fields[0] else socket.AF_INET
            packed = socket.inet_pton(family, fields[0])
        except OSError:
            continue
        if not (packed.startswith(b"\x7f") if family == socket.AF_INET else packed == _IPV6_LOOPBACK):
            found.setdefault(packed, socket.inet_ntop(family, packed))
    return list(found.values())


def _unshare(flags: int) -> None:
    if _libc.unshare(flags) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"unshare({flags:#x}): {os.strerror(err)}")


def _flags(sock: socket.socket, name: str) -> int:
    request = struct.pack("16sH", name.encode(), 0)
    (flags,) = struct.unpack_from("H", fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, request), 16)
    return int(flags)


def _is_up(name: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        return bool(_flags(sock, name) & _IFF_UP)


def _bring_up(name: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        flags = _flags(sock, name)
        if flags & _IFF_UP:
            return  # gVisor makes a new namespace's lo up already (and has no SIOCSIFFLAGS)
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack("16sH", name.encode(), flags | _IFF_UP))


def _add_address(interface: str, address: str) -> None:
    """RTM_NEWADDR over route netlink: `address` as a host address (/32, /128) on `interface`."""
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    packed = socket.inet_pton(family, address)
    prefix = 128 if family == socket.AF_INET6 else 32
    body = struct.pack("BBBBI", family, prefix, 0, 0, socket.if_nametoindex(interface))
    for kind in (_IFA_ADDRESS, _IFA_LOCAL):
        body += struct.pack("HH", 4 + len(packed), kind) + packed
    flags = _NLM_F_REQUEST | _NLM_F_ACK | _NLM_F_CREATE | _NLM_F_EXCL
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE) as sock:
        sock.send(struct.pack("IHHII", 16 + len(body), _RTM_NEWADDR, flags, 1, 0) + body)
        reply = sock.recv(4096)
    if len(reply) < 20 or struct.unpack_from("H", reply, 4)[0] != _NLMSG_ERROR:
        raise OSError(0, f"adding {address} to {interface}: no acknowledgement from the kernel")
    (code,) = struct.unpack_from("i", reply, 16)
    if code:
        raise OSError(-code, f"adding {address} to {interface}: {os.strerror(-code)}")


def _drop_capabilities() -> None:
    """capset to nothing: the creator of a user namespace holds every capability in it, and the
    launcher needs none once lo is up."""
    header = struct.pack("Ii", _CAPABILITY_VERSION_3, 0)
    empty = ctypes.create_string_buffer(24)  # two {effective, permitted, inheritable} words
    if _libc.capset(ctypes.c_char_p(header), empty) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"capset: {os.strerror(err)}")
    with open("/proc/self/status", encoding="ascii") as fh:
        held = {k: v.strip() for k, v in (line.split(":", 1) for line in fh if line.startswith("Cap"))}
    if int(held["CapEff"], 16) or int(held["CapPrm"], 16):
        raise OSError(0, f"capabilities still held after capset: {held}")
