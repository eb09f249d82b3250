"""A hostile job in loopback mode: every way off its loopback it can think of. Each attempt's outcome
goes to result.json ("open: ..." or "refused: <errno name or exception>")."""

import ctypes
import errno
import json
import os
import socket
import struct

TARGETS = json.loads("""@@TARGETS@@""")  # [[name, host, port], ...]: the machine outside the job
OUT = os.environ["POSTTRAIN_OUTPUT_DIR"]
found = {}


def attempt(name, fn):
    try:
        found[name] = "open: " + repr(fn())
    except OSError as exc:
        found[name] = "refused: " + (errno.errorcode.get(exc.errno or 0) or type(exc).__name__)
    except Exception as exc:
        found[name] = "refused: " + type(exc).__name__


def tcp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(3)
        sock.connect((host, port))
        return "connected"


def udp(host, port):
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as sock:
        return sock.sendto(b"escape", (host, port))


for name, host, port in TARGETS:
    attempt(f"tcp {name}", lambda host=host, port=port: tcp(host, port))
    attempt(f"udp {name}", lambda host=host, port=port: udp(host, port))
attempt("icmp ping socket", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
attempt("icmpv6 ping socket", lambda: socket.socket(socket.AF_INET6, socket.SOCK_DGRAM, 58))
attempt("raw inet", lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("raw inet6", lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_RAW))
attempt("packet", lambda: socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0x0300))
attempt("vsock", lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM))
attempt("sctp", lambda: socket.socket(socket.AF_INET, socket.SOCK_STREAM, 132))
attempt("netlink audit", lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 9))


def netlink_route_write():
    """RTM_NEWADDR: give lo an address of the outside network (needs CAP_NET_ADMIN here)."""
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0) as sock:
        sock.bind((0, 0))
        ifaddr = struct.pack("BBBBI", socket.AF_INET, 24, 0, 0, socket.if_nametoindex("lo"))
        attr = struct.pack("HH4s", 8, 2, socket.inet_aton("10.99.0.1"))  # IFA_LOCAL
        flags = 0x405  # NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE
        header = struct.pack("IHHII", 16 + len(ifaddr) + len(attr), 20, flags, 1, 0)  # RTM_NEWADDR
        sock.send(header + ifaddr + attr)
        reply = sock.recv(4096)
        code = struct.unpack_from("i", reply, 16)[0]
        if code:
            raise OSError(-code, os.strerror(-code))
        return "address added"


attempt("netlink route write", netlink_route_write)
libc = ctypes.CDLL(None, use_errno=True)


def syscall(number, *args):
    if libc.syscall(number, *args) == -1:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return "allowed"


attempt("unshare(CLONE_NEWUSER|CLONE_NEWNET)", lambda: syscall(272, 0x10000000 | 0x40000000))
attempt("io_uring_setup", lambda: syscall(425, 8, ctypes.create_string_buffer(120)))
attempt("interfaces", lambda: sorted(name for _, name in socket.if_nameindex()))
with open(os.path.join(OUT, "result.json"), "w") as fh:
    json.dump(found, fh)
