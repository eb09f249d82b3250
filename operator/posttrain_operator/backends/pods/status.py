"""A job pod's state as the backend protocol's `RemoteStatus`: pure, unit-tested."""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from posttrain_operator.api.rules import parse_time
from posttrain_operator.backends.base import RemoteStatus
from posttrain_operator.backends.pods.names import CONTAINER

EXIT_EGRESS_OPEN = 4  # the launcher's code: egress open, no job code ran
# The launcher's own exit code for a job it stopped (launcher.py); its log says so for certain.
LAUNCHER_EXITS = {3: "exit code 3: the launcher stops a job whose outputs pass max_output_bytes"}


def launcher_report(terminated: Mapping[str, Any]) -> dict[str, Any] | None:
    """What the launcher left as the container's termination message (egress.py), if it is one."""
    try:
        report = json.loads(terminated.get("message") or "")
    except ValueError:
        return None
    return report if isinstance(report, dict) else None


def egress_report(terminated: Mapping[str, Any]) -> tuple[bool | None, str]:
    """The launcher's egress report, from the container's termination message. The job runs with the
    launcher's uid and could rewrite it, but only after the check passed: a forged report can only
    understate what was verified, and an open network never starts the job."""
    report = launcher_report(terminated)
    code = terminated.get("exitCode")
    if not isinstance(report, dict) or not isinstance(report.get("egressVerified"), bool):
        return (False, "egress check failed; no job code ran") if code == EXIT_EGRESS_OPEN else (None, "")
    verified = bool(report["egressVerified"]) and code != EXIT_EGRESS_OPEN
    if verified:
        return True, f"{report.get('probes')} probes closed in {report.get('seconds')}s"
    return False, str(report.get("reason") or "egress check failed; no job code ran")[:1024]


def _job_state(status: Mapping[str, Any]) -> dict[str, Any]:
    container: dict[str, Any] = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER), {}
    )
    return dict(container.get("state") or {})


def remote_status(pod: Mapping[str, Any]) -> RemoteStatus:
    """Pod phase and the job container's state -> RemoteStatus. Billing starts when the container
    runs, not when the pod is created (a pod may wait for a node or an image for a long time). A pod
    being deleted is final only once its end is known (`deleted_status`)."""
    base = _phase_status(pod)
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return deleted_status(pod, base)
    return base


def deleted_status(pod: Mapping[str, Any], base: RemoteStatus) -> RemoteStatus:
    """A pod being deleted (the backend's finalizer holds it until its end is read): "cancelled" at
    the run times its kubelet reported as it killed the container, once it has; a pod never bound to a
    node never ran. A pod that Succeeded keeps its outcome; a failed one reads as cancelled, its
    failure in the message: when it ended against the delete cannot be told for certain (the kubelet's
    last delete moves the deletionTimestamp). Until the kubelet reports, `base`: not terminal, so the
    job is neither settled nor the cancel confirmed."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    deadline = parse_time(meta.get("deletionTimestamp"))
    if base.stage == "succeeded":
        return base
    if not (pod.get("spec") or {}).get("nodeName"):
        return RemoteStatus("cancelled", "deleted before it was scheduled; it never ran", raw_stage="Deleted")
    terminated = _job_state(status).get("terminated") or {}
    if base.stage not in ("succeeded", "failed") and not terminated:
        return base
    # The container's own times where the pod's phase lags them (Pending after a kubelet restart).
    started = base.started_at or parse_time(terminated.get("startedAt"))
    finished = base.finished_at or parse_time(terminated.get("finishedAt"))
    # No end recorded (e.g. a phase set by the pod GC): the delete's deadline bounds it from above.
    # No start: it never ran, whatever end the kubelet wrote for the container it never started.
    finished = (finished or deadline) if started else None
    said = f": {base.message}" if base.message else ""
    return dataclasses.replace(
        base,
        stage="cancelled",
        message=f"the pod was deleted while it was on its node{said}"[:1024],
        started_at=started,
        finished_at=finished,
        raw_stage="Deleted",
    )


def _phase_status(pod: Mapping[str, Any]) -> RemoteStatus:
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    state = _job_state(status)
    running, terminated, waiting = state.get("running"), state.get("terminated"), state.get("waiting")
    started = parse_time((running or terminated or {}).get("startedAt"))
    finished = parse_time((terminated or {}).get("finishedAt"))
    if phase == "Pending":
        reason, message = "", ""
        if waiting:
            reason, message = waiting.get("reason") or "", waiting.get("message") or ""
        else:
            for condition in status.get("conditions") or []:
                if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                    reason, message = condition.get("reason") or "", condition.get("message") or ""
        text = f"{reason}: {message}" if reason and message else reason or message
        return RemoteStatus("pending", text, raw_stage=f"Pending/{reason}" if reason else "Pending")
    if phase == "Running":
        return RemoteStatus("running", "", started, None, "Running")
    if phase in ("Succeeded", "Failed"):
        if finished is None and started is not None:
            # e.g. DeadlineExceeded before the kubelet recorded the container's end
            times = [parse_time(c.get("lastTransitionTime")) for c in status.get("conditions") or []]
            finished = max((t for t in times if t is not None), default=None)
        code = (terminated or {}).get("exitCode")
        exit_code = code if isinstance(code, int) else None
        egress, egress_message = egress_report(terminated or {})
        kernel = (launcher_report(terminated or {}) or {}).get("kernel")
        runtime = {"runtime_class": runtime_class(pod), "kernel": kernel if isinstance(kernel, str) else ""}
        if phase == "Succeeded":
            return RemoteStatus(
                "succeeded", "", started, finished, "Succeeded", exit_code, egress, egress_message, **runtime
            )
        parts = [egress_message] if egress is False else []
        if status.get("reason"):
            parts.append(f"{status['reason']}: {status.get('message') or ''}".rstrip(": "))
        if terminated:
            why = terminated.get("reason") or "Error"
            parts.append(f"container exited with code {terminated.get('exitCode')} ({why})")
            if terminated.get("exitCode") in LAUNCHER_EXITS:
                parts.append(LAUNCHER_EXITS[terminated["exitCode"]])
        raw = status.get("reason") or (terminated or {}).get("reason") or ""
        return RemoteStatus(
            "failed",
            "; ".join(parts) or "pod failed",
            started,
            finished,
            f"Failed/{raw}" if raw else "Failed",
            exit_code,
            egress,
            egress_message,
            **runtime,
        )
    # "Unknown": the node stopped reporting. The pod may still be running (and billing).
    return RemoteStatus("running", "the pod's node is not reporting", started, None, phase)


def runtime_class(pod: Mapping[str, Any]) -> str:
    return str((pod.get("spec") or {}).get("runtimeClassName") or "")


# What the kubelet's FailedCreatePodSandBox event says when the node's runtime has no handler for the
# pod's RuntimeClass (containerd; CRI-O). Unlike a slow image or a busy node, it never clears.
_NO_HANDLER = re.compile(
    r'no runtime for "[^"]*" is configured|runtime handler \S+ (?:is not supported|from runtime list)', re.I
)


def waits_for_sandbox(pod: Mapping[str, Any]) -> bool:
    """On a node, but its container not yet created: where a missing runtime handler leaves a pod."""
    scheduled = bool((pod.get("spec") or {}).get("nodeName"))
    return scheduled and remote_status(pod).raw_stage in ("Pending", "Pending/ContainerCreating")


def missing_runtime(pod: Mapping[str, Any], events: Sequence[str]) -> RemoteStatus | None:
    """A terminal failure when one of the pod's sandbox events says its node lacks the handler."""
    said = next((message for message in events if _NO_HANDLER.search(message)), None)
    if said is None:
        return None
    node, wanted = (pod.get("spec") or {}).get("nodeName"), runtime_class(pod)
    why = f"node {node} has no runtime for the pod's RuntimeClass {wanted!r}; the job never started"
    return RemoteStatus(
        "failed",
        f"{why}: {said[:800]}",
        raw_stage="Failed/RuntimeHandlerMissing",
        runtime_class=wanted,
    )
