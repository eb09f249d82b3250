"""Episodes end on their limits or on deletion, and every job they had is cancelled; a cancellation
the backend does not confirm leaves an Orphaned job that blocks the namespace until GC clears it."""

from __future__ import annotations

import pytest

from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl, wait_for
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    wait_phase,
)

LONG_JOBS = pytest.mark.parametrize("emulator", [600.0], indirect=True, ids=["jobs-run-10min"])


def _count_steps(kubectl: Kubectl, namespace: str, steps: int) -> None:
    """What the gateway does on every tool call: the step count in the Episode's status."""
    patch = f'{{"status":{{"steps":{steps}}}}}'
    kubectl("-n", namespace, "patch", "episode", "ep1", "--subresource=status", "--type=merge", "-p", patch)


def _start_with_running_job(kubectl: Kubectl, namespace: str, emulator: HfEmulator, **limits: int) -> str:
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.50", limits=limits))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Running"})
    backend_id: str = job["status"]["backendJobId"]
    emulator.wait_for_stage(backend_id, ("RUNNING",))
    return backend_id


@LONG_JOBS
def test_step_limit_ends_with_reward_zero_and_cancels_jobs(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    backend_id = _start_with_running_job(kubectl, namespace, emulator, maxSteps=3)
    _count_steps(kubectl, namespace, 3)

    episode = wait_phase(kubectl, namespace, "episode", "ep1", {"Completed"})
    assert episode["status"]["outcome"] == "LimitReached"
    assert episode["status"]["reward"] == "0"
    assert "step limit" in episode["status"]["message"]
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Cancelled"})
    assert emulator.job(backend_id)["status"]["stage"] == "CANCELED"
    ledger = wait_for(
        lambda: (e := get(kubectl, namespace, "episode", "ep1"))["status"]["ledger"]["reservedMicroUSD"] == 0
        and e
    )
    assert ledger["status"]["ledger"]["settledMicroUSD"] == job["status"]["settledMicroUSD"] > 0


@LONG_JOBS
def test_wall_time_limit_ends_with_reward_zero(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    backend_id = _start_with_running_job(kubectl, namespace, emulator, maxWallSeconds=4)
    episode = wait_phase(kubectl, namespace, "episode", "ep1", {"Completed"}, timeout=30)
    assert episode["status"]["outcome"] == "LimitReached" and episode["status"]["reward"] == "0"
    assert "wall-time" in episode["status"]["message"]
    wait_phase(kubectl, namespace, "agentjob", "job1", {"Cancelled"})
    assert emulator.job(backend_id)["status"]["stage"] == "CANCELED"


@LONG_JOBS
def test_no_job_is_admitted_after_the_end(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    _start_with_running_job(kubectl, namespace, emulator, maxWallSeconds=3)
    wait_phase(kubectl, namespace, "episode", "ep1", {"Completed"}, timeout=30)
    apply(kubectl, namespace, agentjob_manifest("late", "ep1"))
    job = wait_phase(kubectl, namespace, "agentjob", "late", {"Rejected"})
    assert job["status"]["reason"] == "EpisodeNotRunning"


@LONG_JOBS
def test_deleting_an_episode_cancels_its_backend_jobs_first(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    backend_id = _start_with_running_job(kubectl, namespace, emulator)
    kubectl("-n", namespace, "delete", "episode", "ep1", "--wait=true", "--timeout=60s")
    # The finalizer let go only after the backend confirmed; the job went with the episode.
    assert emulator.job(backend_id)["status"]["stage"] == "CANCELED"
    wait_for(lambda: kubectl("-n", namespace, "get", "agentjob", "job1", check=False).returncode != 0)


@LONG_JOBS
def test_unconfirmed_cancel_orphans_blocks_and_is_collected(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    backend_id = _start_with_running_job(kubectl, namespace, emulator, maxSteps=1)
    emulator.controls.inject("cancel_ignored", job_id=backend_id, count=None)
    _count_steps(kubectl, namespace, 1)

    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Orphaned"})
    assert job["status"]["reason"] == "CancelUnconfirmed"
    episode = wait_for(
        lambda: (e := get(kubectl, namespace, "episode", "ep1"))["status"].get("orphanedJobs") and e
    )
    assert [o["name"] for o in episode["status"]["orphanedJobs"]] == ["job1"]
    orphaned = next(c for c in episode["status"]["conditions"] if c["type"] == "Orphaned")
    assert orphaned["status"] == "True" and "job1" in orphaned["message"]
    assert episode["status"]["ledger"]["reservedMicroUSD"] > 0  # it may still bill: still reserved

    apply(kubectl, namespace, episode_manifest("ep2"))
    blocked_ep = wait_phase(kubectl, namespace, "episode", "ep2", {"Pending"})
    blocked = wait_for(
        lambda: next(
            (
                c
                for c in get(kubectl, namespace, "episode", "ep2")["status"].get("conditions", [])
                if c["type"] == "Blocked"
            ),
            None,
        )
    )
    assert (
        blocked["status"] == "True"
        and blocked["reason"] == "OrphanedJobs"
        and "ep1/job1" in blocked["message"]
    )
    assert blocked_ep["status"]["phase"] == "Pending"

    emulator.controls.clear_faults()
    wait_phase(kubectl, namespace, "agentjob", "job1", {"Cancelled"}, timeout=60)
    assert emulator.job(backend_id)["status"]["stage"] == "CANCELED"
    cleared = wait_for(
        lambda: not (e := get(kubectl, namespace, "episode", "ep1"))["status"].get("orphanedJobs") and e
    )
    assert cleared["status"]["ledger"]["reservedMicroUSD"] == 0
    wait_phase(kubectl, namespace, "episode", "ep2", {"Running"}, timeout=60)


@LONG_JOBS
def test_an_orphan_deleted_unsettled_is_cancelled_by_its_recorded_id_and_settled_at_its_reservation(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    """A user removes the operator's finalizer from an orphaned job and deletes it (the operator is down
    meanwhile, so it cannot put its finalizer back first): the orphan is still collected."""
    backend_id = _start_with_running_job(kubectl, namespace, emulator, maxSteps=1)
    emulator.controls.inject("cancel_ignored", job_id=backend_id, count=None)
    _count_steps(kubectl, namespace, 1)
    reserved = wait_phase(kubectl, namespace, "agentjob", "job1", {"Orphaned"})["status"]["reservedMicroUSD"]
    wait_for(lambda: get(kubectl, namespace, "episode", "ep1")["status"].get("orphanedJobs"))

    operator.stop()
    kubectl("-n", namespace, "patch", "agentjob", "job1", "--type=json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')  # fmt: skip
    kubectl("-n", namespace, "delete", "agentjob", "job1", "--wait=true", "--timeout=30s")
    operator.start().wait_ready()
    emulator.controls.clear_faults()

    cleared = wait_for(
        lambda: not (e := get(kubectl, namespace, "episode", "ep1"))["status"].get("orphanedJobs") and e,
        timeout=60,
        what="the orphan to be collected",
    )
    assert emulator.job(backend_id)["status"]["stage"] == "CANCELED"  # by the id the Episode recorded
    ledger = cleared["status"]["ledger"]
    assert ledger["entries"]["job1"]["settledMicroUSD"] == reserved > 0
    assert (ledger["reservedMicroUSD"], ledger["settledMicroUSD"]) == (0, reserved)
    apply(kubectl, namespace, episode_manifest("ep2"))
    wait_phase(kubectl, namespace, "episode", "ep2", {"Running"})  # the namespace is no longer blocked
