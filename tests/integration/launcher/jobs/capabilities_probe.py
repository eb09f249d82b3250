"""Job script: what must keep working inside the sandbox. Records each check in result.json."""

import concurrent.futures
import json
import multiprocessing
import os
import socket
import tempfile

import numpy as np

OUT = os.environ["POSTTRAIN_OUTPUT_DIR"]


def square(x):
    return x * x


def put_square(queue, x):
    queue.put(x * x)


def unix_sockets():
    a, b = socket.socketpair(socket.AF_UNIX)
    a.sendall(b"ping")
    pair = b.recv(4)
    a.close()
    b.close()
    path = os.path.join(tempfile.mkdtemp(), "s.sock")  # TMPDIR is the job's scratch
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen(1)
    client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    client.connect(path)
    conn, _ = server.accept()
    client.sendall(b"pong")
    stream = conn.recv(4)
    for s in (conn, client, server):
        s.close()
    return (pair + stream).decode()


def main():
    result = {"unix": unix_sockets()}
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        result["threads"] = sum(pool.map(square, range(10)))
    with multiprocessing.get_context("fork").Pool(2) as pool:
        result["mp_fork_pool"] = sum(pool.map(square, range(10)))
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=put_square, args=(queue, 7))
    proc.start()
    result["mp_spawn"] = queue.get(timeout=60)
    proc.join(60)
    # A Manager talks to its server process over an AF_UNIX socket.
    with multiprocessing.get_context("forkserver").Manager() as manager:
        shared = manager.list([1, 2, 3])
        shared.append(4)
        result["mp_manager"] = list(shared)
    result["numpy"] = float(np.arange(10, dtype=np.float64).sum())
    with open(os.path.join(OUT, "result.json"), "w") as fh:
        json.dump(result, fh)


if __name__ == "__main__":
    main()
