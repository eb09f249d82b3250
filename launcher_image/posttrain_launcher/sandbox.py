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
    _prctl(_PR_SET_DUMPABLE, 0)


def die_with_parent() -> None:
    """SIGKILL the job if the launcher dies. Cleared by a uid change, so set it after the drop."""
    _prctl(_PR_SET_PDEATHSIG, 9)


def build_filter() -> seccomp.SyscallFilter:
    """Default allow; non-AF_UNIX sockets and io_uring get EACCES; any foreign ABI kills the process.

    The filter holds the native architecture only, so i386 (`int 0x80`) syscalls hit the bad-arch
    action; on x86_64 libseccomp also sends syscall numbers with the x32 bit (0x40000000) there.
    io_uring is refused because its operations (IORING_OP_SOCKET, ...) bypass the socket rule.
    """
    flt = seccomp.SyscallFilter(defaction=seccomp.ALLOW)
    # KILL (thread) would leave the other threads of a threaded job running.
    flt.set_attr(seccomp.Attr.ACT_BADARCH, seccomp.KILL_PROCESS)
    deny = seccomp.ERRNO(errno.EACCES)
    for name in ("socket", "socketpair"):
        flt.add_rule(deny, name, seccomp.Arg(0, seccomp.NE, socket.AF_UNIX))
    for name in IO_URING_SYSCALLS:
        flt.add_rule(deny, name)
    return flt


def close_inherited_fds() -> None:
    """Close everything but stdin/stdout/stderr (Python uses close_range(2) where it exists)."""
    os.closerange(3, _fd_ceiling())


def _fd_ceiling() -> int:
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return soft if soft != resource.RLIM_INFINITY and soft > 0 else 1 << 20


def set_rlimits(max_file_bytes: int, max_open_files: int, max_processes: int, max_memory_bytes: int) -> None:
    """Each file the job writes is capped (EFBIG: Python ignores SIGXFSZ); no core dumps; the job's
    uid may run `max_processes` processes and threads (per user namespace: on a shared host without
    one, that count is shared by every job of uid 10000); each process allocates at most
    `max_memory_bytes` (RLIMIT_DATA: heap and private writable mappings; the backend's memory
    cgroup bounds the job as a whole). Not RLIMIT_AS: the address space torch's libraries reserve
    alone passes 3 GiB, so a bound on it would stop `import torch` on a small flavor.

    Raises SandboxError unless every limit is in place and no higher than asked.
    """
    limits = {
        resource.RLIMIT_CORE: 0,
        resource.RLIMIT_FSIZE: max_file_bytes,
        resource.RLIMIT_NOFILE: max_open_files,
        resource.RLIMIT_NPROC: max_processes,
        resource.RLIMIT_DATA: max_memory_bytes,
    }
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


def lock_down(max_file_bytes: int, max_open_files: int, max_processes: int, max_memory_bytes: int) -> None:
    """Everything between fork and exec, in order. Raises SandboxError if any step fails.

    The filter is built before the fds are closed (libseccomp may open files) and loaded before
    the privilege drop, so the drop runs under it; it allows setgroups/setresuid, which the drop
    needs. no_new_privs comes first: loading a filter without CAP_SYS_ADMIN requires it.
    """
    flt = build_filter()
    close_inherited_fds()
    set_rlimits(max_file_bytes, max_open_files, max_processes, max_memory_bytes)
    set_no_new_privs()
    try:
        flt.load()
    except OSError as exc:
        raise SandboxError(f"seccomp filter did not load: {exc}") from None
    drop_privileges()
    die_with_parent()
