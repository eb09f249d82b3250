"""Test helpers shared by every layer: polling instead of sleeping, kubectl on the devstack cluster."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from devstack.controlplane import cluster as devcluster


def wait_for(
    predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.2, what: str = ""
) -> Any:
    """Poll until `predicate` returns a truthy value; fail with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        last = predicate()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}; last value {last!r}")


async def wait_for_async(
    predicate: Callable[[], Awaitable[Any]], within: float = 30.0, interval: float = 0.2, what: str = ""
) -> Any:
    """`wait_for` for a coroutine predicate, sleeping on the event loop."""
    deadline = time.monotonic() + within
    last: Any = None
    while time.monotonic() < deadline:
        last = await predicate()
        if last:
            return last
        await asyncio.sleep(interval)
    raise AssertionError(f"timed out after {within}s waiting for {what or predicate}; last value {last!r}")


def kubectl_json(kubectl: Callable[..., subprocess.CompletedProcess[str]], *args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)


Kubectl = Callable[..., subprocess.CompletedProcess[str]]


def make_kubectl(state: devcluster.ClusterState, kubeconfig: Path | None = None) -> Kubectl:
    def kubectl(*args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [str(state.kubectl()), f"--kubeconfig={kubeconfig or state.kubeconfig}", *args],
            capture_output=True,
            text=True,
            input=input,
            timeout=60,
        )
        if check and proc.returncode != 0:
            raise AssertionError(f"kubectl {' '.join(args)} failed: {proc.stderr}")
        return proc

    return kubectl
