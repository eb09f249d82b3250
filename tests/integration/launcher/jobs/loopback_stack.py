"""What a training stack needs of loopback (run by the tests in loopback mode): torchrun's TCPStore and
a gloo all-reduce across two processes, an HTTP server and a client in the same job, and the
interfaces getifaddrs lists."""

import ctypes
import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import urllib.request

OUT = os.environ["POSTTRAIN_OUTPUT_DIR"]
WORKER = """
import torch, torch.distributed as dist
dist.init_process_group("gloo")
total = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(total)
if dist.get_rank() == 0:
    print("all-reduce sum", total.item(), flush=True)
dist.destroy_process_group()
"""


class IfAddrs(ctypes.Structure):
    pass


IfAddrs._fields_ = [("ifa_next", ctypes.POINTER(IfAddrs)), ("ifa_name", ctypes.c_char_p)]


def getifaddrs() -> list[str]:
    libc = ctypes.CDLL(None, use_errno=True)
    head = ctypes.POINTER(IfAddrs)()
    if libc.getifaddrs(ctypes.byref(head)) != 0:
        return ["getifaddrs failed: " + os.strerror(ctypes.get_errno())]
    names, node = set(), head
    while node:
        names.add(node.contents.ifa_name.decode())
        node = node.contents.ifa_next
    libc.freeifaddrs(head)
    return sorted(names)


worker = os.path.join(os.environ["TMPDIR"], "allreduce.py")
with open(worker, "w") as fh:
    fh.write(WORKER)
logs = os.path.join(os.environ["TMPDIR"], "torchrun.log")
with open(logs, "w") as sink:
    # A session of its own: on a timeout, the workers go too.
    torchrun = subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
         "--rdzv-backend", "c10d", "--rdzv-endpoint", "127.0.0.1:0", worker],
        stdout=sink, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        returncode = torchrun.wait(timeout=90)
    except subprocess.TimeoutExpired:
        os.killpg(torchrun.pid, signal.SIGKILL)
        returncode = torchrun.wait()
with open(logs) as fh:
    output = fh.read()
print(output[-4000:], file=sys.stderr)


class Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"hello from localhost")

    def log_message(self, *args: object) -> None:
        pass


server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Hello)
threading.Thread(target=server.serve_forever, daemon=True).start()
opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
body = opener.open(f"http://127.0.0.1:{server.server_address[1]}/", timeout=30).read().decode()
server.shutdown()

result = {
    "torchrun": returncode,
    "sum": [line for line in output.splitlines() if line.startswith("all-reduce sum")],
    "http": body,
    "getifaddrs": getifaddrs(),
    "env": {k: os.environ.get(k) for k in ("POSTTRAIN_NETWORK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")},
}
with open(os.path.join(OUT, "result.json"), "w") as fh:
    json.dump(result, fh)
