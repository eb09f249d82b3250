"""Where a pods job ran (its RuntimeClass, the kernel its launcher saw), and a pod whose node has no
handler for its RuntimeClass: failed, never billed, rather than waiting for ever."""

from __future__ import annotations

import json
from typing import Any

import pytest
from posttrain_operator.api.models import AgentJobStatus
from posttrain_operator.backends.pods.status import missing_runtime, remote_status, waits_for_sandbox

STARTED, FINISHED = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
GVISOR_KERNEL = "4.4.0 #1 SMP Sun Jan 10 15:06:54 PST 2016"
CONTAINERD_SAYS = (
    "Failed to create pod sandbox: rpc error: code = Unknown desc = failed to get sandbox runtime: "
    'no runtime for "runsc" is configured'
)
CRIO_SAYS = (
    'Failed to create pod sandbox: rpc error: code = Unknown desc = runtime handler "runsc" is not supported'
)


def _pod(
    phase: str, state: dict[str, Any] | None = None, node: str | None = "node-a", **spec: Any
) -> dict[str, Any]:
    containers = [{"name": "job", "state": state}] if state is not None else []
    return {
        "metadata": {"name": "j", "namespace": "pt-x", "uid": "u-1"},
        "spec": {**({"nodeName": node} if node else {}), **spec},
        "status": {"phase": phase, "containerStatuses": containers},
    }


def _ended(code: int, report: dict[str, Any] | None) -> dict[str, Any]:
    terminated = {"exitCode": code, "startedAt": STARTED, "finishedAt": FINISHED}
    return {"terminated": terminated | ({"message": json.dumps(report)} if report else {})}


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_a_finished_pod_reports_its_runtime_class_and_the_kernel_its_launcher_saw(phase: str) -> None:
    report = {"egressVerified": True, "probes": 7, "rounds": 1, "seconds": 1.0, "kernel": GVISOR_KERNEL}
    status = remote_status(
        _pod(phase, _ended(0 if phase == "Succeeded" else 1, report), runtimeClassName="gvisor")
    )
    assert (status.runtime_class, status.kernel) == ("gvisor", GVISOR_KERNEL)
    # The node's default runtime: an empty class; a report without a kernel (an older launcher): none.
    plain = remote_status(_pod(phase, _ended(0, {"egressVerified": True, "kernel": ["not", "text"]})))
    assert (plain.runtime_class, plain.kernel) == ("", "")
    # Where it ran is recorded on the AgentJob as the API's type.
    recorded = AgentJobStatus.model_validate({"runtime": {"runtimeClass": "gvisor", "kernel": GVISOR_KERNEL}})
    assert recorded.runtime is not None and recorded.runtime.runtime_class == "gvisor"


def test_only_a_scheduled_pod_whose_container_is_not_yet_created_waits_for_its_sandbox() -> None:
    creating = {"waiting": {"reason": "ContainerCreating"}}
    assert waits_for_sandbox(_pod("Pending", creating))
    assert waits_for_sandbox(_pod("Pending"))  # no container status yet
    assert not waits_for_sandbox(_pod("Pending", creating, node=None))  # not on a node: the scheduler's
    assert not waits_for_sandbox(_pod("Pending", {"waiting": {"reason": "ImagePullBackOff"}}))
    assert not waits_for_sandbox(_pod("Running", {"running": {"startedAt": STARTED}}))


@pytest.mark.parametrize("said", [CONTAINERD_SAYS, CRIO_SAYS])
def test_a_missing_runtime_handler_fails_the_job_with_the_kubelets_words(said: str) -> None:
    pod = _pod("Pending", {"waiting": {"reason": "ContainerCreating"}}, runtimeClassName="gvisor")
    status = missing_runtime(pod, ["Failed to create pod sandbox: a transient network error", said])
    assert status is not None
    assert (status.stage, status.raw_stage, status.runtime_class) == (
        "failed",
        "Failed/RuntimeHandlerMissing",
        "gvisor",
    )
    assert "node node-a has no runtime for the pod's RuntimeClass 'gvisor'" in status.message
    assert said in status.message
    assert status.started_at is None  # never started: nothing is billed


def test_other_sandbox_failures_leave_the_pod_waiting() -> None:
    pod = _pod("Pending", {"waiting": {"reason": "ContainerCreating"}}, runtimeClassName="gvisor")
    assert missing_runtime(pod, []) is None
    transient = (
        "Failed to create pod sandbox: plugin type=bridge failed (add): failed to allocate for range 0"
    )
    assert missing_runtime(pod, [transient]) is None
