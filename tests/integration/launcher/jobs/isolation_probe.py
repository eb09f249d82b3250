"""Job script: tries each way out of the sandbox and records what happened in result.json.

Also run outside the sandbox by the control test, so every probe must work in both settings.
`@@PORT@@` is replaced with the port of a listener the test holds on 127.0.0.1.
"""

import ctypes
import errno
import json
import os
import platform
import socket
import subprocess
import sys

OUT = os.environ["POSTTRAIN_OUTPUT_DIR"]
PORT = int("@@PORT@@")
CAP = int("@@CAP@@")
result: dict[str, object] = {}


def outcome(fn):  # "ok" or the errno name
    try:
        fn()
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, f"errno {exc.errno}")
    return "ok"


def make_socket(family, kind):
    def run():
        socket.socket(family, kind).close()

    return run


result["sockets"] = {
    "AF_INET": outcome(make_socket(socket.AF_INET, socket.SOCK_STREAM)),
    "AF_INET6": outcome(make_socket(socket.AF_INET6, socket.SOCK_DGRAM)),
    "AF_NETLINK": outcome(make_socket(socket.AF_NETLINK, socket.SOCK_RAW)),
    "AF_PACKET": outcome(make_socket(socket.AF_PACKET, socket.SOCK_RAW)),
    "AF_VSOCK": outcome(make_socket(socket.AF_VSOCK, socket.SOCK_STREAM)),
}
result["socketpair_inet"] = outcome(lambda: socket.socketpair(socket.AF_INET))

libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
SYS_SOCKET = {"x86_64": 41, "aarch64": 198}[platform.machine()]
SYS_IO_URING_SETUP = 425


def raw_syscall(nr, *args):
    ctypes.set_errno(0)
    ret = libc.syscall(ctypes.c_long(nr), *[ctypes.c_long(a) for a in args])
    err = ctypes.get_errno()
    if ret >= 0:
        os.close(ret)
        return "ok"
    return errno.errorcode.get(err, f"errno {err}")


result["raw_socket_syscall"] = raw_syscall(SYS_SOCKET, socket.AF_INET, socket.SOCK_STREAM, 0)
params = ctypes.create_string_buffer(120)  # struct io_uring_params, zeroed
result["io_uring_setup"] = raw_syscall(SYS_IO_URING_SETUP, 1, ctypes.addressof(params))

# Foreign-ABI syscalls, each in a child process, since the expected outcome is a kill.
MACHINE_CODE = """
import ctypes, mmap, sys
code = bytes.fromhex(sys.argv[1])
buf = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
buf.write(code)
fn = ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(buf)))
print(ctypes.c_int(fn()).value)
"""
FOREIGN = {
    # push rbx; mov eax,102 (socketcall); mov ebx,1 (SYS_SOCKET); xor ecx,ecx; int 0x80; pop rbx; ret
    "i386_socketcall": "53b866000000bb0100000031c9cd805bc3",
    # mov eax,0x40000029 (x32 bit | socket); mov edi,2 (AF_INET); mov esi,1; xor edx,edx; syscall; ret
    "x32_socket": "b829000040bf02000000be0100000031d20f05c3",
}
if platform.machine() == "x86_64":
    for name, code in FOREIGN.items():
        proc = subprocess.run([sys.executable, "-c", MACHINE_CODE, code], capture_output=True, text=True)
        result[name] = {"returncode": proc.returncode, "value": proc.stdout.strip()}


def resolve(host):
    try:
        socket.getaddrinfo(host, 443)
    except socket.gaierror as exc:
        return f"gaierror {exc.errno}"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, "oserror")
    return "ok"


result["dns"] = {host: resolve(host) for host in ("pypi.org", "example.com")}
result["connect_loopback"] = outcome(lambda: socket.create_connection(("127.0.0.1", PORT), timeout=5).close())

result["env"] = dict(os.environ)
with open("/proc/self/environ", "rb") as fh:
    result["proc_self_environ"] = fh.read().decode(errors="replace")

status = {}
with open("/proc/self/status") as fh:
    for line in fh:
        key, _, value = line.partition(":")
        status[key] = value.strip()
result["status"] = {
    k: status[k] for k in ("Uid", "Gid", "Groups", "CapEff", "CapPrm", "NoNewPrivs", "Seccomp")
}


def read_file(path):
    def run():
        with open(path, "rb") as fh:
            fh.read(1)

    return run


result["proc1_environ"] = outcome(read_file("/proc/1/environ"))
result["parent_environ"] = outcome(read_file(f"/proc/{os.getppid()}/environ"))

model = os.environ["POSTTRAIN_INPUT_MODEL"]


def append_input():
    with open(os.path.join(model, "weights.bin"), "ab") as fh:
        fh.write(b"x")


def create_in_input():
    with open(os.path.join(model, "new.bin"), "wb") as fh:
        fh.write(b"x")


result["inputs"] = {
    "append": outcome(append_input),
    "create": outcome(create_in_input),
    "unlink": outcome(lambda: os.unlink(os.path.join(model, "config.json"))),
    "chmod": outcome(lambda: os.chmod(os.path.join(model, "weights.bin"), 0o666)),
    "read": outcome(read_file(os.path.join(model, "weights.bin"))),
}

big = os.path.join(OUT, "big.bin")


def write_bytes(n):
    def run():
        with open(big, "ab") as fh:
            fh.write(b"\x00" * n)

    return run


result["output_cap"] = {"to_cap": outcome(write_bytes(CAP)), "past_cap": outcome(write_bytes(1))}
os.unlink(big)  # keep the total under the cap, which another test covers

with open(os.path.join(OUT, "result.json"), "w") as fh:
    json.dump(result, fh)
