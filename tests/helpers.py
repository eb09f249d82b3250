"""Test helpers shared by every layer: polling instead of sleeping, kubectl output as JSON."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable
from typing import Any


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


def kubectl_json(kubectl: Callable[..., subprocess.CompletedProcess[str]], *args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json").stdout)
