"""Agent job: tries to reach a sibling job given its host pids, and the host's abstract socket.

Everything it observes goes to result.json; the test asserts that every attempt failed.
"""

import ctypes
import errno
import json
import os
import socket

OUT = os.environ["POSTTRAIN_OUTPUT_DIR"]
VICTIM_PIDS = json.loads("[@@VICTIM_PIDS@@]")
ABSTRACT = "@@ABSTRACT@@"
NEEDLES = ["@@VICTIM_VALUE@@", "@@SPLIT_MARKER@@"]
PTRACE_ATTACH = 16
libc = ctypes.CDLL(None, use_errno=True)
result: dict[str, object] = {}


def outcome(fn):
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))
    return "ok"


def read(path):
    def run():
        with open(path, "rb") as fh:
            fh.read(4096)

    return run


def ptrace(pid):
    def run():
        ctypes.set_errno(0)
        if libc.ptrace(ctypes.c_long(PTRACE_ATTACH), ctypes.c_long(pid), None, None) != 0:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err))

    return run


def connect_abstract():
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect("\0" + ABSTRACT)


attempts = {}
for pid in VICTIM_PIDS:
    attempts[str(pid)] = {
        "environ": outcome(read(f"/proc/{pid}/environ")),
        "mem": outcome(read(f"/proc/{pid}/mem")),
        "cmdline": outcome(read(f"/proc/{pid}/cmdline")),
        "signal_0": outcome(lambda pid=pid: os.kill(pid, 0)),
        "sigterm": outcome(lambda pid=pid: os.kill(pid, 15)),
        "ptrace": outcome(ptrace(pid)),
    }
result["attempts"] = attempts
result["abstract_socket"] = outcome(connect_abstract)

# Everything this job can see of processes: its own namespace only.
visible, found = [], []
for entry in os.listdir("/proc"):
    if not entry.isdigit():
        continue
    visible.append(int(entry))
    for name in ("environ", "cmdline"):
        try:
            with open(f"/proc/{entry}/{name}", "rb") as fh:
                data = fh.read()
        except OSError:
            continue
        found += [f"/proc/{entry}/{name}" for needle in NEEDLES if needle.encode() in data]
result["visible_pids"] = sorted(visible)
result["found"] = found
with open(os.path.join(OUT, "result.json"), "w") as fh:
    json.dump(result, fh)
