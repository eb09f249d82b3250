"""The local backend's container runtime: one job in its own namespaces, cgroup and file system view.

The emulator (root) starts `python -I -S jail.py` with a `JailSpec` as JSON on stdin. Standard library
only, so it runs as a plain script. Three processes:

- the **keeper** (in the host's namespaces, in the job's cgroups): joins the cgroups, creates the PID
  namespace, forks the init, passes SIGTERM/SIGINT/SIGHUP on to it, turns SIGUSR1 into SIGKILL of the
  init, and exits with the job's code (128+N when it was killed by signal N) once the init is reaped.
  When the init of a PID namespace dies the kernel kills every other process in it, and the init is
  only reaped after all of them are gone: so the keeper's exit means no process of the job is left.
- the **init** (PID 1 of the job): new mount, network (loopback only), IPC, UTS and cgroup
  namespaces; a tmpfs root holding only the spec's binds, a fresh /proc, /dev, /tmp and a few /etc
  files; then forks the payload, forwards signals to it, reaps orphans, and exits with its code.
- the **payload**: in a user namespace of its own (uid 0 and `job_uid` mapped to themselves), so
  that per-user counts such as RLIMIT_NPROC count this job only; then execs the job's argv. The
  other namespaces stay owned by the host's user namespace: even the job's root cannot change its
  mounts or network.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import fcntl
import json
import os
import select
import signal
import socket
import struct
import sys
from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWCGROUP = 0x02000000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_REC = 16384
MS_PRIVATE = 1 << 18
MS_RELATIME = 1 << 21
MNT_DETACH = 2

_PR_SET_PDEATHSIG = 1
_SYS_PIVOT_ROOT = {"x86_64": 155, "aarch64": 41}
_SIOCGIFFLAGS = 0x8913
_SIOCSIFFLAGS = 0x8914
_IFF_UP = 0x1

# statvfs flags a bind remount must keep: in a mount namespace they may be locked.
_KEPT_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
DEVICES = ("null", "zero", "full", "random", "urandom", "tty")
EXIT_SETUP_FAILED = 125  # as container runtimes report their own failure

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long


@dataclasses.dataclass(frozen=True)
class Bind:
    source: str
    target: str
    read_only: bool = True


@dataclasses.dataclass(frozen=True)
class JailSpec:
    argv: list[str]
    env: dict[str, str]
    cwd: str
    new_root: str  # an empty directory on the host; the job's tmpfs root is mounted over it
    binds: list[Bind]
    symlinks: dict[str, str]  # path in the view -> link target (e.g. /bin -> usr/bin)
    files: dict[str, str]  # path in the view -> content (e.g. /etc/passwd)
    cgroup_procs: list[str]  # `cgroup.procs` files of the job's cgroups, joined before anything else
    tmp_bytes: int
    hostname: str = "job"
    job_uid: int = 10000
    user_namespace: bool = True

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> JailSpec:
        data: dict[str, Any] = json.loads(text)
        data["binds"] = [Bind(**b) for b in data["binds"]]
        return cls(**data)


class JailError(RuntimeError):
    pass


def _check(ret: int, what: str) -> None:
    if ret != 0:
        err = ctypes.get_errno()
        raise JailError(f"{what}: {os.strerror(err)}")


def _unshare(flags: int) -> None:
    _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({flags:#x})")


def _mount(source: str | None, target: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _check(_libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]), f"mount {target}")


def _prctl(option: int, arg: int) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0), f"prctl({option})")


def _kept_flags(path: str) -> int:
    flags = os.statvfs(path).f_flag
    return sum(ms for st, ms in _KEPT_FLAGS.items() if flags & st)


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _bind(root: str, bind: Bind) -> None:
    target = _inside(root, bind.target)
    if os.path.isdir(bind.source):
        os.makedirs(target, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            os.close(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644))
    _mount(bind.source, target, None, MS_BIND | MS_REC)
    flags = MS_BIND | MS_REMOUNT | MS_NOSUID | _kept_flags(target)
    if bind.read_only:
        flags |= MS_RDONLY
    _mount(None, target, None, flags)


def _make_dev(root: str) -> None:
    dev = _inside(root, "/dev")
    os.makedirs(dev, exist_ok=True)
    _mount("tmpfs", dev, "tmpfs", MS_NOSUID | MS_NOEXEC, "mode=0755,size=64k")
    for name in DEVICES:
        if os.path.exists(f"/dev/{name}"):
            _bind(root, Bind(f"/dev/{name}", f"/dev/{name}", read_only=False))
    for name, target in {
        "fd": "/proc/self/fd",
        "stdin": "/proc/self/fd/0",
        "stdout": "/proc/self/fd/1",
        "stderr": "/proc/self/fd/2",
    }.items():
        os.symlink(target, os.path.join(dev, name))


def _build_view(spec: JailSpec) -> None:
    root = spec.new_root
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below propagates back to the host
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m")
    scratch = f"mode=1777,size={spec.tmp_bytes}"
    # /tmp first: the job's own tree may live under the host's /tmp, and is bound over it.
    os.makedirs(_inside(root, "/tmp"))
    _mount("tmpfs", _inside(root, "/tmp"), "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    for bind in sorted(spec.binds, key=lambda b: b.target.count("/")):
        _bind(root, bind)
    for path, target in spec.symlinks.items():
        os.makedirs(os.path.dirname(_inside(root, path)), exist_ok=True)
        os.symlink(target, _inside(root, path))
    for path, content in spec.files.items():
        os.makedirs(os.path.dirname(_inside(root, path)), exist_ok=True)
        with open(_inside(root, path), "w", encoding="utf-8") as fh:
            fh.write(content)
    _make_dev(root)
    os.makedirs(_inside(root, "/dev/shm"))
    _mount("tmpfs", _inside(root, "/dev/shm"), "tmpfs", MS_NOSUID | MS_NODEV, scratch)
    os.makedirs(_inside(root, "/proc"), exist_ok=True)
    _mount("proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    _mount(None, root, None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(root)
    nr = _SYS_PIVOT_ROOT[os.uname().machine]
    _check(_libc.syscall(ctypes.c_long(nr), b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "umount old root")
    os.chdir("/")


def _loopback_up() -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(sock, _SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(sock, _SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | _IFF_UP))


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    return 128 - code if code < 0 else code


def _forward(pid: int, kill_on_usr1: bool) -> None:
    def handler(signum: int, _frame: object) -> None:
        sig = signal.SIGKILL if signum == signal.SIGUSR1 and kill_on_usr1 else signum
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):
        signal.signal(sig, handler)


def _payload(spec: JailSpec, ready: int, mapped: int) -> None:
    """Never returns."""
    try:
        if spec.user_namespace:
            _unshare(CLONE_NEWUSER)
            os.write(ready, b"u")
            if os.read(mapped, 1) != b"m":
                raise JailError("the init did not map the user namespace")
        os.chdir(spec.cwd)
        os.execve(spec.argv[0], spec.argv, spec.env)
    except BaseException as exc:
        os.write(2, f"[jail] cannot start the job: {exc}\n".encode(errors="replace"))
        os._exit(EXIT_SETUP_FAILED)


def _map_user_namespace(pid: int, job_uid: int) -> None:
    mapping = f"0 0 1\n{job_uid} {job_uid} 1\n"
    for name in ("uid_map", "gid_map"):
        with open(f"/proc/{pid}/{name}", "w") as fh:
            fh.write(mapping)


def _init(spec: JailSpec, keeper_alive: int) -> None:
    """PID 1 of the job. Never returns.

    `keeper_alive` is the read end of a pipe only the keeper writes to: EOF means the keeper died
    before the death signal was armed (getppid() is 0 for a namespace's init, so it cannot tell).
    """
    try:
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if select.select([keeper_alive], [], [], 0)[0]:
            os._exit(EXIT_SETUP_FAILED)
        os.close(keeper_alive)
        os.setsid()
        _unshare(CLONE_NEWNS | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWCGROUP)
        _build_view(spec)
        socket.sethostname(spec.hostname)
        _loopback_up()
        ready_r, ready_w = os.pipe()
        mapped_r, mapped_w = os.pipe()
        payload = os.fork()
        if payload == 0:
            os.close(ready_r)
            os.close(mapped_w)
            _payload(spec, ready_w, mapped_r)
        os.close(ready_w)
        os.close(mapped_r)
        _forward(payload, kill_on_usr1=False)
        if spec.user_namespace:
            if os.read(ready_r, 1) != b"u":
                raise JailError("the payload did not create its user namespace")
            _map_user_namespace(payload, spec.job_uid)
            os.write(mapped_w, b"m")
        os.close(ready_r)
        os.close(mapped_w)
    except BaseException as exc:
        os.write(2, f"[jail] cannot set up the job: {exc}\n".encode(errors="replace"))
        os._exit(EXIT_SETUP_FAILED)
    while True:  # reap every orphan; end with the payload
        pid, status = os.waitpid(-1, 0)
        if pid == payload:
            os._exit(_exit_code(status))


def main() -> int:
    spec = JailSpec.from_json(sys.stdin.read())
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    try:
        for procs in spec.cgroup_procs:
            with open(procs, "w") as fh:
                fh.write(str(os.getpid()))
        _unshare(CLONE_NEWPID)
    except (OSError, JailError) as exc:
        sys.stderr.write(f"[jail] cannot set up the job: {exc}\n")
        return EXIT_SETUP_FAILED
    alive_r, alive_w = os.pipe()
    init = os.fork()
    if init == 0:
        os.close(alive_w)
        _init(spec, alive_r)
    os.close(alive_r)
    _forward(init, kill_on_usr1=True)
    while True:
        pid, status = os.waitpid(init, 0)
        if pid == init:
            return _exit_code(status)


if __name__ == "__main__":
    sys.exit(main())
