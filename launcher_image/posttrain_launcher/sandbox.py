"""The lockdown applied to the job process between fork and exec. Linux only; x86_64 and aarch64."""

from __future__ import annotations

import ctypes
import errno
import os
import resource
import socket

import pyseccomp as seccomp

JOB_UID = 10000
JOB_GID = 10000

_PR_SET_PDEATHSIG = 1
_PR_SET_DUMPABLE = 4
_PR_SET_NO_NEW_PRIVS = 38

IO_URING_SYSCALLS = ("io_uring_setup", "io_uring_enter", "io_uring_register")

_libc = ctypes.CDLL(None, use_errno=True)


class SandboxError(RuntimeError):
    """The lockdown could not be applied; the job must not run."""


def _prctl(option: int, arg: int) -> None:
    if _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) != 0:
        err = ctypes.get_errno()
        raise SandboxError(f"prctl({option}) failed: {os.strerror(err)}")


def set_no_new_privs() -> None:
    """execve can then never grant privileges (setuid bits, file capabilities) to the job."""
    _prctl(_PR_SET_NO_NEW_PRIVS, 1)


def set_non_dumpable() -> None:
    """Makes this process's /proc files (environ, mem) unreadable and un-ptraceable by the job,
    which matters when launcher and job share a uid (an image running as USER 10000)."""
    set_dumpable(False)


def set_dumpable(dumpable: bool) -> None:
    _prctl(_PR_SET_DUMPABLE, int(dumpable))


def die_with_parent() -> None:
    """SIGKILL the job if the launcher dies. Cleared by a uid change, so set it after the drop."""
    _prctl(_PR_SET_PDEATHSIG, 9)


# Namespaces the job may not make (a new user namespace widens the kernel surface it can reach;
# a network namespace of its own is no way out, but nothing a job runs needs one either).
CLONE_NAMESPACE_FLAGS = (
    0x00020000,  # CLONE_NEWNS
    0x02000000,  # CLONE_NEWCGROUP
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x10000000,  # CLONE_NEWUSER
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
)
AF_NETLINK = 16
NETLINK_ROUTE = 0
# In loopback mode: the families a job may open, and the socket types and protocols it may not.
LOOPBACK_FAMILIES = (socket.AF_UNIX, socket.AF_INET, socket.AF_INET6, AF_NETLINK)
INET_REFUSED_TYPES = (3, 4, 5, 6, 10)  # SOCK_RAW, SOCK_RDM, SOCK_SEQPACKET, SOCK_DCCP, SOCK_PACKET
INET_REFUSED_PROTOCOLS = {socket.AF_INET: (1, 132, 255), socket.AF_INET6: (58, 132, 255)}  # ICMP, SCTP, RAW
SOCK_TYPE_MASK = 0xF
MAX_FAMILY = 64


def build_filter(network: str = "unix") -> seccomp.SyscallFilter:
    """Default allow; what the network mode does not allow, io_uring and new namespaces get EACCES
    (clone3, whose flags a filter cannot read, ENOSYS: libc then falls back to clone); any foreign
    ABI kills the process.

    The filter holds the native architecture only, so i386 (`int 0x80`) syscalls hit the bad-arch
    action; on x86_64 libseccomp also sends syscall numbers with the x32 bit (0x40000000) there.
    io_uring is refused because its operations (IORING_OP_SOCKET, ...) bypass the socket rule.
    """
    flt = _kill_process_on_bad_arch()
    deny = seccomp.ERRNO(errno.EACCES)
    flt.add_rule(deny, "socketpair", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    if network == "loopback":
        _loopback_socket_rules(flt, deny)
    else:
        flt.add_rule(deny, "socket", seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    for name in IO_URING_SYSCALLS:
        flt.add_rule(deny, name)
    for name in ("unshare", "setns"):
        flt.add_rule(deny, name)
    for flag in CLONE_NAMESPACE_FLAGS:
        flt.add_rule(deny, "clone", seccomp.Arg(0, seccomp.MASKED_EQ, flag, flag))
    flt.add_rule(seccomp.ERRNO(errno.ENOSYS), "clone3")
    return flt


def _kill_process_on_bad_arch() -> seccomp.SyscallFilter:
    """A filter whose foreign-ABI action kills the process: KILL (thread) would leave the other
    threads of a threaded job running. libseccomp asks the kernel which actions it has (API level
    3); gVisor's kernel has KILL_PROCESS but does not answer that question, so libseccomp assumes an
    older one and refuses it. Level 3 is then asserted: a kernel truly without it refuses the filter
    when it is loaded, and the job does not run."""
    flt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    try:
        flt.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    except OSError:
        seccomp.set_api(3)
        flt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
        flt.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    return flt


def _loopback_socket_rules(flt: seccomp.SyscallFilter, deny: int) -> None:
    """socket(): AF_UNIX; AF_INET and AF_INET6 stream and datagram sockets but not ICMP or SCTP;
    AF_NETLINK for route messages only (the kernel refuses their writes without CAP_NET_ADMIN)."""
    for family in range(MAX_FAMILY):
        if family not in LOOPBACK_FAMILIES:
            flt.add_rule(deny, "socket", seccomp.Arg(0, seccomp.EQ, family))
    flt.add_rule(deny, "socket", seccomp.Arg(0, seccomp.GE, MAX_FAMILY))
    netlink = seccomp.Arg(0, seccomp.EQ, AF_NETLINK)
    flt.add_rule(deny, "socket", netlink, seccomp.Arg(2, seccomp.NE, NETLINK_ROUTE))
    for family, protocols in INET_REFUSED_PROTOCOLS.items():
        for kind in INET_REFUSED_TYPES:
            flt.add_rule(
                deny,
                "socket",
                seccomp.Arg(0, seccomp.EQ, family),
                seccomp.Arg(1, seccomp.MASKED_EQ, SOCK_TYPE_MASK, kind),
            )
        for protocol in protocols:
            inet = seccomp.Arg(0, seccomp.EQ, family)
            flt.add_rule(deny, "socket", inet, seccomp.Arg(2, seccomp.EQ, protocol))


def close_inherited_fds() -> None:
    """Close everything but stdin/stdout/stderr (Python uses close_range(2) where it exists)."""
    os.closerange(3, _fd_ceiling())


def _fd_ceiling() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 20


def set_rlimits(
    max_file_bytes: int, max_open_files: int, max_processes: int, max_memory_bytes: int | None
) -> None:
    """Each file the job writes is capped (EFBIG: Python ignores SIGXFSZ); no core dumps; the job's
    uid may run `max_processes` processes and threads (per user namespace: on a shared host without
    one, that count is shared by every job of uid 10000); each process allocates at most
    `max_memory_bytes` (RLIMIT_DATA: heap and private writable mappings), None where the backend's
    memory cgroup bounds the job as a whole (bounds.py). Not RLIMIT_AS: the address space torch's
    libraries reserve alone passes 3 GiB, so a bound on it would stop `import torch` on a small flavor.

    Raises SandboxError unless every limit is in place and no higher than asked.
    """
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_FSIZE: max_file_bytes,
        resource.RLIMIT_NOFILE: max_open_files,
        resource.RLIMIT_NPROC: max_processes,
    }
    if max_memory_bytes is not None:
        limits[resource.RLIMIT_DATA] = max_memory_bytes
    for which, value in limits.items():
        _, hard = resource.getrlimit(which)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(which, (value, value))
        except (OSError, ValueError) as exc:
            raise SandboxError(f"cannot set resource limit {which} to {value}: {exc}") from None
        soft, hard = resource.getrlimit(which)
        if resource.RLIM_INFINITY in (soft, hard) or max(soft, hard) > limits[which]:
            raise SandboxError(f"resource limit {which} is {soft}/{hard}, not at most {limits[which]}")


def drop_privileges() -> None:
    """As root: clear supplementary groups, then gid, then uid (all of real/effective/saved).

    The uid change from 0 clears every capability (no SECBIT_KEEP_CAPS). Without root there is
    nothing to drop: the image runs as USER 10000 already.
    """
    if os.geteuid() != 0:
        return
    os.setgroups([])
    os.setresgid(JOB_GID, JOB_GID, JOB_GID)
    os.setresuid(JOB_UID, JOB_UID, JOB_UID)
    if os.getresuid() != (JOB_UID,) * 3 or os.getresgid() != (JOB_GID,) * 3 or os.getgroups():
        raise SandboxError("privilege drop did not take effect")
    try:
        os.setuid(0)
    except PermissionError:
        return
    raise SandboxError("could regain uid 0 after the drop")


def lock_down(
    max_file_bytes: int,
    max_open_files: int,
    max_processes: int,
    max_memory_bytes: int | None,
    network: str = "unix",
) -> None:
    """Everything between fork and exec, in order. Raises SandboxError if any step fails.

    The filter is built before the fds are closed (libseccomp may open files) and loaded before
    the privilege drop, so the drop runs under it; it allows setgroups/setresuid, which the drop
    needs. no_new_privs comes first: loading a filter without CAP_SYS_ADMIN requires it.
    """
    flt = build_filter(network)
    close_inherited_fds()
    set_rlimits(max_file_bytes, max_open_files, max_processes, max_memory_bytes)
    set_no_new_privs()
    try:
        flt.load()
    except OSError as exc:
        raise SandboxError(f"seccomp filter did not load: {exc}") from None
    drop_privileges()
    die_with_parent()
