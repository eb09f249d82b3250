"""What a test reads of an orchestrator's tool step: its result, and a job waited out to its end."""

from __future__ import annotations

from typing import Any

from tests.integration.gateway.support import Orchestrator


def result(step: dict[str, Any]) -> dict[str, Any]:
    """The tool's result data; fails the test with the observation if the step was an error."""
    assert step["observation"]["error"] is None, step["observation"]
    data: dict[str, Any] = step["observation"]["result"]["data"]
    return data


async def finished(orch: Orchestrator, name: str, wait_seconds: float = 20) -> dict[str, Any]:
    """The job once it has ended, waited for with jobs_wait."""
    waited: dict[str, Any] = {"finished": False}
    while not waited["finished"]:
        waited = result(await orch.call("jobs_wait", job=name, timeout_seconds=wait_seconds))
    job: dict[str, Any] = waited["job"]
    return job
