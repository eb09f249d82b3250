"""The compiled seccomp filter, evaluated by a small classic-BPF interpreter: no kernel involved.

This is what shows that x32 syscalls are killed, which a kernel built without x32 cannot show
(it answers ENOSYS with or without the filter).
"""

from __future__ import annotations

import errno
import platform
import socket
import struct
import tempfile

import pytest
from posttrain_launcher.sandbox import build_filter

AUDIT_ARCH_X86_64 = 0xC000003E
AUDIT_ARCH_I386 = 0x40000003
X32_BIT = 0x40000000
ALLOW = 0x7FFF0000
KILL_PROCESS = 0x80000000
EACCES = 0x00050000 | errno.EACCES

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64", reason="syscall numbers are x86_64's")


def compiled(network: str = "unix") -> list[tuple[int, int, int, int]]:
    with tempfile.TemporaryFile() as fh:
        build_filter(network).export_bpf(fh)
        fh.seek(0)
        data = fh.read()
    return [struct.unpack("<HBBI", data[i : i + 8]) for i in range(0, len(data), 8)]


def run_bpf(prog: list[tuple[int, int, int, int]], nr: int, arch: int, args: tuple[int, ...] = ()) -> int:
    """Evaluate against struct seccomp_data {int nr; u32 arch; u64 ip; u64 args[6]}."""
    argv = (list(args) + [0] * 6)[:6]
    data = struct.pack("<iIQ6Q", nr, arch, 0, *argv)
    acc, pc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        cls = code & 0x07
        if cls == 0x00:  # BPF_LD | BPF_W | BPF_ABS
            assert code == 0x20, hex(code)
            acc = struct.unpack_from("<I", data, k)[0]
        elif cls == 0x05:  # BPF_JMP
            op = code & 0xF0
            if op == 0x00:  # JA
                pc += k
            else:
                taken = {0x10: acc == k, 0x20: acc > k, 0x30: acc >= k, 0x40: bool(acc & k)}[op]
                pc += jt if taken else jf
        elif cls == 0x04:  # BPF_ALU (libseccomp's masked compares)
            assert code == 0x54, hex(code)  # BPF_ALU | BPF_AND | BPF_K
            acc &= k
        elif cls == 0x06:  # BPF_RET | BPF_K
            return k
        else:
            raise AssertionError(f"unexpected BPF instruction {code:#x}")
        pc += 1


@pytest.mark.parametrize(
    ("what", "nr", "arch", "args", "want"),
    [
        ("socket(AF_INET)", 41, AUDIT_ARCH_X86_64, (socket.AF_INET, 1, 0), EACCES),
        ("socket(AF_INET6)", 41, AUDIT_ARCH_X86_64, (socket.AF_INET6, 2, 0), EACCES),
        ("socket(AF_UNIX)", 41, AUDIT_ARCH_X86_64, (socket.AF_UNIX, 1, 0), ALLOW),
        # A family with high bits set must not slip through as AF_UNIX.
        ("socket(1 | 1<<32)", 41, AUDIT_ARCH_X86_64, ((1 << 32) | 1, 1, 0), EACCES),
        ("socketpair(AF_INET)", 53, AUDIT_ARCH_X86_64, (socket.AF_INET, 1, 0), EACCES),
        ("socketpair(AF_UNIX)", 53, AUDIT_ARCH_X86_64, (socket.AF_UNIX, 1, 0), ALLOW),
        ("io_uring_setup", 425, AUDIT_ARCH_X86_64, (), EACCES),
        ("io_uring_enter", 426, AUDIT_ARCH_X86_64, (), EACCES),
        ("io_uring_register", 427, AUDIT_ARCH_X86_64, (), EACCES),
        ("read", 0, AUDIT_ARCH_X86_64, (), ALLOW),
        ("setresuid", 117, AUDIT_ARCH_X86_64, (), ALLOW),  # the privilege drop runs under the filter
        ("setgroups", 116, AUDIT_ARCH_X86_64, (), ALLOW),
        ("x32 socket", X32_BIT | 41, AUDIT_ARCH_X86_64, (socket.AF_INET,), KILL_PROCESS),
        ("x32 read", X32_BIT | 0, AUDIT_ARCH_X86_64, (), KILL_PROCESS),
        ("i386 socketcall", 102, AUDIT_ARCH_I386, (1, 0), KILL_PROCESS),
        ("i386 getpid", 20, AUDIT_ARCH_I386, (), KILL_PROCESS),
    ],
)
def test_filter_decisions(what: str, nr: int, arch: int, args: tuple[int, ...], want: int) -> None:
    assert run_bpf(compiled(), nr, arch, args) == want, what


ENOSYS = 0x00050000 | errno.ENOSYS
SOCKET, CLONE, UNSHARE, SETNS, CLONE3 = 41, 56, 272, 308, 435
SOCK_NONBLOCK_CLOEXEC = 0o4000 | 0o2000000
CLONE_NEWUSER, CLONE_NEWNET, CLONE_THREAD_FLAGS = 0x10000000, 0x40000000, 0x3D0F00


@pytest.mark.parametrize(
    ("what", "nr", "args", "want"),
    [
        ("tcp", SOCKET, (socket.AF_INET, socket.SOCK_STREAM, 0), ALLOW),
        ("tcp, flags", SOCKET, (socket.AF_INET, socket.SOCK_STREAM | SOCK_NONBLOCK_CLOEXEC, 6), ALLOW),
        ("udp6", SOCKET, (socket.AF_INET6, socket.SOCK_DGRAM, 17), ALLOW),
        ("unix", SOCKET, (socket.AF_UNIX, socket.SOCK_STREAM, 0), ALLOW),
        ("route netlink (getifaddrs)", SOCKET, (16, socket.SOCK_RAW | SOCK_NONBLOCK_CLOEXEC, 0), ALLOW),
        ("raw inet", SOCKET, (socket.AF_INET, socket.SOCK_RAW, 255), EACCES),
        ("raw inet, flags", SOCKET, (socket.AF_INET, socket.SOCK_RAW | SOCK_NONBLOCK_CLOEXEC, 6), EACCES),
        ("raw inet6", SOCKET, (socket.AF_INET6, socket.SOCK_RAW, 58), EACCES),
        ("packet type", SOCKET, (socket.AF_INET, 10, 0), EACCES),
        ("seqpacket (sctp)", SOCKET, (socket.AF_INET, socket.SOCK_SEQPACKET, 132), EACCES),
        ("sctp stream", SOCKET, (socket.AF_INET6, socket.SOCK_STREAM, 132), EACCES),
        ("icmp ping socket", SOCKET, (socket.AF_INET, socket.SOCK_DGRAM, 1), EACCES),
        ("icmpv6 ping socket", SOCKET, (socket.AF_INET6, socket.SOCK_DGRAM, 58), EACCES),
        ("AF_PACKET", SOCKET, (17, socket.SOCK_RAW, 0x300), EACCES),
        ("AF_VSOCK", SOCKET, (40, socket.SOCK_STREAM, 0), EACCES),
        ("AF_BLUETOOTH", SOCKET, (31, socket.SOCK_STREAM, 0), EACCES),
        ("netlink audit", SOCKET, (16, socket.SOCK_RAW, 9), EACCES),
        ("netlink netfilter", SOCKET, (16, socket.SOCK_RAW, 12), EACCES),
        ("family past the table", SOCKET, (200, socket.SOCK_STREAM, 0), EACCES),
        ("high bits on AF_INET", SOCKET, ((1 << 32) | socket.AF_INET, 1, 0), EACCES),
        ("io_uring_setup", 425, (), EACCES),
    ],
)
def test_loopback_mode_allows_tcp_udp_and_route_reads_only(
    what: str, nr: int, args: tuple[int, ...], want: int
) -> None:
    assert run_bpf(compiled("loopback"), nr, AUDIT_ARCH_X86_64, args) == want, what


@pytest.mark.parametrize("network", ["unix", "loopback"])
@pytest.mark.parametrize(
    ("what", "nr", "args", "want"),
    [
        ("unshare(CLONE_NEWUSER)", UNSHARE, (CLONE_NEWUSER,), EACCES),
        ("unshare(CLONE_NEWNET)", UNSHARE, (CLONE_NEWNET,), EACCES),
        ("setns", SETNS, (3, 0), EACCES),
        ("clone with CLONE_NEWUSER", CLONE, (CLONE_NEWUSER | 17,), EACCES),
        ("clone with CLONE_NEWNET", CLONE, (CLONE_NEWNET | 17,), EACCES),
        ("clone3 (its flags are out of reach)", CLONE3, (0, 88), ENOSYS),
        ("clone of a thread", CLONE, (CLONE_THREAD_FLAGS,), ALLOW),
        ("clone of a process (fork)", CLONE, (17,), ALLOW),
    ],
)
def test_no_job_makes_a_namespace_in_either_mode(
    network: str, what: str, nr: int, args: tuple[int, ...], want: int
) -> None:
    assert run_bpf(compiled(network), nr, AUDIT_ARCH_X86_64, args) == want, what
