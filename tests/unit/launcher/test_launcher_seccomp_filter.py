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


def compiled() -> list[tuple[int, int, int, int]]:
    with tempfile.TemporaryFile() as fh:
        build_filter().export_bpf(fh)
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
