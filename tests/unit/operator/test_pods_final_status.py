"""A job pod's final status, read before it disappears: every job pod carries the backend's
finalizer, so a deleted pod stays until the backend has read the run times its kubelet reports as it
kills the container. The bug this prevents (docs/benchmarks.md, the pods chaos soak, seed 2): a
cancel that read the pod before its container's start showed (Pending, just after a kubelet restart)
settled a job that ran at nothing."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import pytest
from kubernetes_asyncio import client
from posttrain_operator.backends.base import Handle
from posttrain_operator.backends.pods import Flavor, PodsBackend, PodsConfig
from posttrain_operator.backends.pods.names import POD_FINALIZER, episode_namespace
from posttrain_operator.backends.pods.status import remote_status

STARTED, KILLED = "2026-01-01T00:00:10Z", "2026-01-01T00:00:45Z"
ASKED, DEADLINE = "2026-01-01T00:00:40Z", "2026-01-01T00:00:45Z"  # the delete, and it plus 5 s grace
JOB_ID = "pt-x/job-1"


def _pod(phase: str = "Pending", state: dict[str, Any] | None = None, node: str | None = "node-a") -> dict:
    return {
        "metadata": {"name": "job-1", "namespace": "pt-x", "uid": "u-1", "finalizers": [POD_FINALIZER],
                     "labels": {"posttrain.dev/managed-by": "posttrain"}},
        "spec": {"nodeName": node} if node else {},
        "status": {"phase": phase, "containerStatuses": [{"name": "job", "state": state}] if state else []},
    }  # fmt: skip


def _deleted(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    pod["metadata"] |= {"deletionTimestamp": DEADLINE, "deletionGracePeriodSeconds": 5}
    return pod


def _killed(phase: str = "Failed", started: str | None = STARTED) -> dict[str, Any]:
    """What the kubelet reports once it has killed the container of a deleted pod."""
    terminated = {"exitCode": 137, "reason": "Error", "finishedAt": KILLED} | (
        {"startedAt": started} if started else {}
    )
    return _deleted(_pod(phase, {"terminated": terminated}))


def _at(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def test_a_deleted_pod_is_not_final_until_its_kubelet_reports_the_container_end() -> None:
    # The bug's read: bound to a node, still Pending (its kubelet restarting), no container state.
    pending = remote_status(_deleted(_pod("Pending")))
    assert pending.stage == "pending"
    running = remote_status(_deleted(_pod("Running", {"running": {"startedAt": STARTED}})))
    assert (running.stage, running.started_at) == ("running", _at(STARTED))


@pytest.mark.parametrize("phase", ["Failed", "Pending", "Running"])
def test_a_deleted_pod_whose_container_ended_is_cancelled_at_the_times_the_kubelet_wrote(phase: str) -> None:
    """Whatever the pod's phase says yet: the container's own start and end are what ran."""
    final = remote_status(_killed(phase))
    assert (final.stage, final.raw_stage) == ("cancelled", "Deleted")
    assert (final.started_at, final.finished_at) == (_at(STARTED), _at(KILLED))


def test_a_deleted_pod_never_bound_to_a_node_never_ran() -> None:
    final = remote_status(_deleted(_pod("Pending", node=None)))
    assert (final.stage, final.started_at, final.finished_at) == ("cancelled", None, None)


def test_a_deleted_pod_killed_before_its_container_started_bills_nothing() -> None:
    final = remote_status(_killed(started=None))
    assert (final.stage, final.started_at, final.finished_at) == ("cancelled", None, None)


def test_a_deleted_pod_that_succeeded_keeps_its_outcome_and_a_failed_one_says_why_it_ended() -> None:
    ended = {"terminated": {"exitCode": 0, "startedAt": STARTED, "finishedAt": ASKED}}
    final = remote_status(_deleted(_pod("Succeeded", ended)))
    assert (final.stage, final.finished_at) == ("succeeded", _at(ASKED))
    oom = {"terminated": {"exitCode": 137, "reason": "OOMKilled", "startedAt": STARTED, "finishedAt": ASKED}}
    final = remote_status(_deleted(_pod("Failed", oom)))
    assert (final.stage, final.exit_code, final.finished_at) == ("cancelled", 137, _at(ASKED))
    assert "container exited with code 137 (OOMKilled)" in final.message


def test_a_deleted_pod_failed_with_no_container_end_is_billed_to_its_deadline() -> None:
    """E.g. the pod GC's phase on a pod whose node went: the delete's deadline bounds the run above."""
    pod = _deleted(_pod("Failed", {"running": {"startedAt": STARTED}}))
    final = remote_status(pod)
    assert (final.stage, final.started_at, final.finished_at) == ("cancelled", _at(STARTED), _at(DEADLINE))


class _FakeCalls:
    """The API server as the backend sees it: one pod, which a delete marks (the finalizer holds it)."""

    def __init__(self, pod: dict[str, Any]) -> None:
        self.pods = {JOB_ID: pod}
        self.kubelet_reports: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.released: list[str] = []
        self.deletes = 0

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        if self.pods.get(JOB_ID, {}).get("metadata", {}).get("deletionTimestamp") and self.kubelet_reports:
            self.pods[JOB_ID] = self.kubelet_reports.pop(0)
        return copy.deepcopy(self.pods.get(f"{namespace}/{name}"))

    async def delete_pod(self, namespace: str, name: str) -> None:
        self.deletes += 1
        self.pods[JOB_ID] = _deleted(self.pods[JOB_ID])

    async def call(self, method: str, fn: Any, **_: Any) -> Any:
        if method == "list_event_for_all_namespaces":
            return {"items": self.events}
        assert method == "list_pod_for_all_namespaces", method
        return {"items": [copy.deepcopy(p) for p in self.pods.values()]}

    async def release_pod(self, pod: dict[str, Any]) -> None:
        self.released.append(pod["metadata"]["name"])
        self.pods.pop(f"{pod['metadata']['namespace']}/{pod['metadata']['name']}", None)

    async def release_namespace_pods(self, namespace: str) -> None:
        self.pods = {k: v for k, v in self.pods.items() if not k.startswith(f"{namespace}/")}


@pytest.fixture
async def backend(tmp_path: Any) -> AsyncIterator[PodsBackend]:
    config = PodsConfig(
        image="launcher:test", flavors={"cpu-basic": Flavor("1", "2Gi", 167)},
        store_volume={"nfs": {"server": "s", "path": "/"}}, store_path=str(tmp_path),
        confirm_timeout_seconds=5.0, cancel_grace_seconds=5,
    )  # fmt: skip
    async with client.ApiClient() as api:  # never called: the tests replace the backend's calls
        yield PodsBackend(config, api, clock=lambda: datetime(2026, 1, 1, 0, 0, 40, tzinfo=UTC))


async def test_a_cancel_read_before_the_start_showed_bills_the_start_its_kubelet_reports(
    backend: PodsBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = _FakeCalls(_pod("Pending"))  # running, but its restarted kubelet has not said so yet
    calls.kubelet_reports = [_deleted(_pod("Pending")), _killed("Failed")]
    monkeypatch.setattr(backend, "_calls", calls)
    handle = Handle(JOB_ID)
    assert await backend.cancel(handle) is True
    assert calls.deletes == 1
    final = (await backend.status_many([handle]))[JOB_ID]
    assert (final.stage, final.started_at, final.finished_at) == ("cancelled", _at(STARTED), _at(KILLED))
    assert await backend.cancel(handle) is True and calls.deletes == 1  # confirmed: no second delete
    calls.pods.clear()  # its finalizer gone (the episode released): what was read stays
    again = (await backend.status_many([handle]))[JOB_ID]
    assert (again.stage, again.started_at, again.finished_at) == ("cancelled", _at(STARTED), _at(KILLED))


async def test_releasing_an_episode_releases_its_pods_before_deleting_its_namespace(
    backend: PodsBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Else the namespace's deletion would wait for ever on the pods the finalizer holds."""
    calls, order = _FakeCalls(_killed()), []

    async def release(namespace: str) -> None:
        order.append(("release", namespace))

    async def delete(_: Any, namespace: str) -> bool:
        order.append(("delete", namespace))
        return True

    monkeypatch.setattr(calls, "release_namespace_pods", release)
    monkeypatch.setattr(backend, "_calls", calls)
    monkeypatch.setattr("posttrain_operator.backends.pods.backend.delete_namespace", delete)
    assert await backend.release_episode("team-a", "ep1") is True
    name = episode_namespace(backend.config.namespace_prefix, "team-a", "ep1")
    assert order == [("release", name), ("delete", name)]


async def test_a_restarted_operator_reads_the_final_status_of_a_pod_deleted_before_it_died(
    backend: PodsBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No memory of the cancel survives; the pod, held by its finalizer, does."""
    calls = _FakeCalls(_killed("Failed"))
    monkeypatch.setattr(backend, "_calls", calls)
    final = (await backend.status_many([Handle(JOB_ID)]))[JOB_ID]
    assert (final.stage, final.started_at, final.finished_at) == ("cancelled", _at(STARTED), _at(KILLED))
    assert await backend.cancel(Handle(JOB_ID)) is True and calls.deletes == 0


async def test_a_pod_whose_node_never_reports_leaves_the_cancel_unconfirmed(
    backend: PodsBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never settled at nothing: the job stays Orphaned (its reservation held) and is retried."""
    calls = _FakeCalls(_pod("Running", {"running": {"startedAt": STARTED}}))
    monkeypatch.setattr(backend, "_calls", calls)
    monkeypatch.setattr(backend, "config", dataclasses.replace(backend.config, confirm_timeout_seconds=0.0))
    assert await backend.cancel(Handle(JOB_ID)) is False
    assert (await backend.status_many([Handle(JOB_ID)]))[JOB_ID].stage == "running"


async def test_a_pod_failed_for_a_missing_runtime_is_deleted_and_released_at_once(
    backend: PodsBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It never ran and its status comes from the kubelet's events: nothing to hold it for."""
    calls = _FakeCalls(_pod("Pending"))
    calls.events = [{"involvedObject": {"uid": "u-1"}, "message": 'no runtime for "runsc" is configured'}]
    monkeypatch.setattr(backend, "_calls", calls)
    for _ in range(2):  # and after it is gone
        status = (await backend.status_many([Handle(JOB_ID)]))[JOB_ID]
        assert (status.stage, status.started_at) == ("failed", None)
        assert status.raw_stage == "Failed/RuntimeHandlerMissing"
    assert (calls.deletes, calls.released, calls.pods) == (1, ["job-1"], {})
