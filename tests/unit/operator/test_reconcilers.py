"""The reconcilers end to end over an in-memory API server, backend and clock: admission and
submission, the in-flight submission window, finishing and grading, the poller's deadline, orphans
and their backoff, and compare-and-swap conflicts. Milliseconds each; the integration suite proves the
same paths against the real API server and the HF emulator."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import pytest
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.rules import (
    EPISODE_LABEL,
    FINALIZER,
    episode_owner,
    format_time,
    new_job_metadata,
)
from posttrain_operator.backends.base import BackendError, PackagePin, RemoteStatus
from posttrain_operator.config import OperatorSettings
from posttrain_operator.k8s import Kube
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.ending import settle_ended
from posttrain_operator.reconcile.episode import reconcile_episode
from posttrain_operator.reconcile.jobs import Retry
from posttrain_operator.reconcile.orphans import collect_orphans
from posttrain_operator.reconcile.poller import ActiveJobs, PassPacer, poll_once

from tests.unit.operator.fakes import FakeBackend, FakeClock, FakeKubernetes

NS = "ns"
CPU_BASIC = 167  # micro-dollars a minute in the fake backend
API_VERSION = "posttrain.dev/v1alpha1"


@dataclass
class World:
    api: FakeKubernetes
    backend: FakeBackend
    clock: FakeClock
    ctx: Context

    def episode(self, name: str = "ep", **spec: Any) -> None:
        body = {"task": "t0_artifact", "budgetUSD": "1.00", "backend": "hf-jobs", "agentTokenHash": "0" * 64}
        meta = {"name": name}
        self.api.put("episodes", NS, {"apiVersion": API_VERSION, "kind": "Episode", "metadata": meta,
                                      "spec": {**body, **spec}})  # fmt: skip

    def job(self, name: str = "j1", episode: str = "ep", **spec: Any) -> None:
        body = {"episode": episode, "purpose": "train", "script": "print(1)", "flavor": "cpu-basic",
                "timeoutSeconds": 600}  # fmt: skip
        meta = {"name": name}
        self.api.put("agentjobs", NS, {"apiVersion": API_VERSION, "kind": "AgentJob", "metadata": meta,
                                       "spec": {**body, **spec}})  # fmt: skip

    def status(self, plural: str, name: str) -> dict[str, Any]:
        status: dict[str, Any] = self.api.obj(plural, NS, name).get("status") or {}
        return status

    def ledger(self, episode: str = "ep") -> dict[str, Any]:
        ledger: dict[str, Any] = self.status("episodes", episode)["ledger"]
        return ledger

    async def poll(self) -> None:
        """A status pass now, whatever the last one cost."""
        await poll_once(self.ctx, self.watched(), PassPacer(interval=0.0, requests_per_minute=math.inf))

    def watched(self) -> ActiveJobs:
        """What the AgentJob watch would have told the poller by now."""
        active = ActiveJobs()
        for (plural, _, _), obj in sorted(self.api.objects.items()):
            if plural == "agentjobs":
                active.observe(obj)
        return active


@pytest.fixture
def world() -> World:
    return make_world()


def make_world() -> World:
    api, backend, clock = FakeKubernetes(), FakeBackend(), FakeClock()
    settings = OperatorSettings(
        hf_http_timeout_seconds=30, orphan_retry_initial_seconds=5, orphan_retry_max_seconds=60,
        job_deadline_grace_seconds=60,
    )  # fmt: skip
    ctx = Context(kube=Kube(api, api, api), backends={"hf-jobs": backend}, settings=settings, clock=clock)
    return World(api, backend, clock, ctx)


async def started(world: World, **spec: Any) -> World:
    world.episode(**spec)
    await reconcile_episode(world.ctx, NS, "ep")
    assert world.status("episodes", "ep")["phase"] == "Running"
    return world


async def test_a_new_job_is_admitted_and_submitted_in_one_pass_with_two_status_writes(world: World) -> None:
    await started(world)
    world.job()
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1")

    status = world.status("agentjobs", "j1")
    job_id = world.backend.only_job()
    assert status["phase"] == "Running" and status["backendJobId"] == job_id
    assert status["idempotencyKey"] == world.backend.jobs[job_id].request.key
    assert status["submitStartedAt"] == format_time(world.clock())
    assert {c["type"]: c["status"] for c in status["conditions"]} == {"Admitted": "True", "Submitted": "True"}
    reserved = CPU_BASIC * 10  # ten minutes of timeout
    assert status["reservedMicroUSD"] == reserved
    assert world.ledger()["entries"] == {"j1": {"reservedMicroUSD": reserved, "platform": False}}
    assert world.ledger()["reservedMicroUSD"] == reserved
    # Read the job, its namespace's quota (none) and its Episode, write the ledger once, adopt the job,
    # write its status twice.
    assert world.api.calls == {
        "get_namespaced_custom_object": 3,
        "replace_namespaced_custom_object_status": 1,
        "patch_namespaced_custom_object": 1,
        "patch_namespaced_custom_object_status": 2,
    }
    assert world.backend.stats.calls == {"price": 1, "submit": 1}  # a new key needs no lookup
    owners = world.api.obj("agentjobs", NS, "j1")["metadata"]["ownerReferences"]
    assert [(o["kind"], o["name"]) for o in owners] == [("Episode", "ep")]


async def test_a_job_made_as_the_gateway_makes_it_is_not_patched(world: World) -> None:
    await started(world)
    world.job()
    made = new_job_metadata("j1", world.api.obj("episodes", NS, "ep"))
    assert made["finalizers"] == [FINALIZER]
    world.api.objects[("agentjobs", NS, "j1")]["metadata"].update(made)
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["phase"] == "Running"
    assert "patch_namespaced_custom_object" not in world.api.calls


async def test_an_owned_job_without_the_label_is_labelled(world: World) -> None:
    await started(world)
    world.job()
    owner = episode_owner(world.api.obj("episodes", NS, "ep"))
    world.api.objects[("agentjobs", NS, "j1")]["metadata"]["ownerReferences"] = [owner]
    await reconcile_agentjob(world.ctx, NS, "j1")
    meta = world.api.obj("agentjobs", NS, "j1")["metadata"]
    assert meta["labels"] == {EPISODE_LABEL: "ep"} and meta["ownerReferences"] == [owner]


@pytest.mark.parametrize(
    ("episode_spec", "job_spec", "reason"),
    [
        ({"budgetUSD": "0.001"}, {}, cond.BUDGET_EXCEEDED),
        ({}, {"flavor": "a100-large"}, cond.INVALID_JOB),
        ({}, {"episode": "nowhere"}, cond.EPISODE_NOT_FOUND),
        ({}, {"timeoutSeconds": 86400}, cond.INVALID_JOB),
    ],
    ids=["over-budget", "flavor-not-allowed", "no-such-episode", "timeout-over-the-limit"],
)
async def test_a_refused_job_is_rejected_with_one_write_and_no_reservation(
    world: World, episode_spec: dict[str, Any], job_spec: dict[str, Any], reason: str
) -> None:
    await started(world, **episode_spec)
    world.job(**job_spec)
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1")

    status = world.status("agentjobs", "j1")
    assert (status["phase"], status["reason"]) == ("Rejected", reason)
    assert (status["reservedMicroUSD"], status["settledMicroUSD"]) == (0, 0)  # the whole status, always
    assert world.ledger()["entries"] == {} and world.ledger()["reservedMicroUSD"] == 0
    assert world.api.calls["patch_namespaced_custom_object_status"] == 1
    assert "replace_namespaced_custom_object_status" not in world.api.calls
    assert "submit" not in world.backend.stats.calls


async def test_jobs_beyond_the_concurrency_limit_are_rejected(world: World) -> None:
    await started(world, limits={"maxConcurrentJobs": 1})
    world.job("j1")
    world.job("j2")
    await reconcile_agentjob(world.ctx, NS, "j1")
    await reconcile_agentjob(world.ctx, NS, "j2")
    assert world.status("agentjobs", "j1")["phase"] == "Running"
    assert world.status("agentjobs", "j2")["reason"] == cond.TOO_MANY_JOBS
    assert list(world.ledger()["entries"]) == ["j1"]


async def test_a_ledger_write_that_loses_a_race_is_retried_from_a_fresh_read(world: World) -> None:
    await started(world)
    world.job()
    world.api.conflicts["replace_namespaced_custom_object_status"] = 3
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1")

    assert world.status("agentjobs", "j1")["phase"] == "Running"
    assert list(world.ledger()["entries"]) == ["j1"]
    assert world.api.calls["replace_namespaced_custom_object_status"] == 4
    # The first attempt used the Episode admission had read (with the job and the quota); each retry
    # read it again.
    assert world.api.calls["get_namespaced_custom_object"] == 3 + 3


async def test_a_stale_episode_copy_costs_one_retry_and_never_a_lost_update(world: World) -> None:
    await started(world)
    world.job()
    # Another writer (the gateway counting a step) changes the Episode after admission read it.
    original = world.api.get_namespaced_custom_object
    bumped: list[str] = []

    async def read_then_bump(*args: Any, **kwargs: Any) -> dict[str, Any]:
        body = await original(*args, **kwargs)
        if args[3] == "episodes" and not bumped:
            bumped.append(body["metadata"]["resourceVersion"])
            await world.api.patch_namespaced_custom_object_status(*args, {"status": {"steps": 7}})
        return body

    world.api.get_namespaced_custom_object = read_then_bump  # type: ignore[method-assign]
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1")
    episode = world.status("episodes", "ep")
    assert episode["steps"] == 7 and list(episode["ledger"]["entries"]) == ["j1"]
    assert world.api.calls["replace_namespaced_custom_object_status"] == 2


async def test_a_submission_in_flight_is_waited_out_then_never_repeated(world: World) -> None:
    await started(world)
    world.job()
    world.backend.fail_submit = BackendError("read timed out", transient=True)
    with pytest.raises(Retry):
        await reconcile_agentjob(world.ctx, NS, "j1")
    status = world.status("agentjobs", "j1")
    assert status["phase"] == "Admitted" and status["submitStartedAt"] == format_time(world.clock())

    # The request may still reach the backend: later passes look it up every few seconds, and send
    # nothing until the window has closed.
    world.backend.fail_submit = None
    settings = world.ctx.settings
    window, recheck = settings.submission_window_seconds, settings.submission_recheck_seconds
    waited = 0.0
    while waited < window:
        with pytest.raises(Retry) as waiting:
            await reconcile_agentjob(world.ctx, NS, "j1")
        assert waiting.value.delay == pytest.approx(min(recheck, window - waited))
        assert world.backend.stats.calls["submit"] == 1 and world.backend.jobs == {}
        world.clock.advance(waiting.value.delay)
        waited += waiting.value.delay
    await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["phase"] == "Running"
    assert world.backend.stats.calls["submit"] == 2 and len(world.backend.jobs) == 1


async def test_a_job_the_backend_took_before_the_operator_died_is_found_not_resubmitted(world: World) -> None:
    await started(world)
    world.job()
    original = world.backend.submit

    async def accepted_then_lost(request: Any) -> Any:
        await original(request)
        raise BackendError("connection reset", transient=True)

    world.backend.submit = accepted_then_lost  # type: ignore[method-assign]
    with pytest.raises(Retry):
        await reconcile_agentjob(world.ctx, NS, "j1")
    await reconcile_agentjob(world.ctx, NS, "j1")

    job_id = world.backend.only_job()
    assert world.status("agentjobs", "j1")["backendJobId"] == job_id
    assert world.backend.stats.calls["submit"] == 1 and world.backend.stats.calls["find"] == 1


async def test_a_permanent_submission_failure_fails_the_job_and_frees_its_budget(world: World) -> None:
    await started(world)
    world.job()
    world.backend.fail_submit = BackendError("flavor retired", transient=False)
    await reconcile_agentjob(world.ctx, NS, "j1")
    status = world.status("agentjobs", "j1")
    assert (status["phase"], status["reason"]) == ("Failed", cond.SUBMISSION_FAILED)
    assert world.ledger()["reservedMicroUSD"] == 0 and world.ledger()["settledMicroUSD"] == 0


async def test_a_finished_job_is_settled_at_its_billed_minutes(world: World) -> None:
    await started(world)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    job_id = world.backend.only_job()
    begun = world.clock() + timedelta(seconds=5)
    world.backend.set_stage(job_id, RemoteStatus("running", started_at=begun, raw_stage="RUNNING"))
    await world.poll()
    status = world.status("agentjobs", "j1")
    assert status["backendStage"] == "RUNNING" and status["startedAt"] == format_time(begun)
    assert status["reservedMicroUSD"] == CPU_BASIC * 10  # the poller wrote only what it saw

    world.backend.artifact_files["ns/ep/j1"] = {"answer.json": b"{}"}
    ended = begun + timedelta(seconds=61)
    world.backend.set_stage(job_id, RemoteStatus("succeeded", "", begun, ended, "COMPLETED", exit_code=0))
    await world.poll()

    status = world.status("agentjobs", "j1")
    assert (status["phase"], status["billedSeconds"], status["exitCode"]) == ("Succeeded", 61, 0)
    assert status["settledMicroUSD"] == 2 * CPU_BASIC and status["reservedMicroUSD"] == 0
    assert status["artifacts"] == [{"path": "answer.json", "size": 2}]
    ledger = world.ledger()
    assert (ledger["reservedMicroUSD"], ledger["settledMicroUSD"]) == (0, 2 * CPU_BASIC)


async def test_a_dev_evaluation_reads_its_score_from_the_result_file(world: World) -> None:
    await started(world)
    world.job("ev", purpose="devEval", script="", checkpointFrom="j0")
    await reconcile_agentjob(world.ctx, NS, "ev")
    job_id = world.backend.only_job()
    result = {"status": "ok", "score": 0.955, "n": 200, "grader_version": "1"}
    world.backend.artifact_files["ns/ep/ev"] = {"result.json": json.dumps(result).encode()}
    world.backend.set_stage(job_id, RemoteStatus("succeeded", "", world.clock(), world.clock(), "COMPLETED"))
    await world.poll()
    assert world.status("agentjobs", "ev")["result"] == {
        "status": "ok", "score": "0.955", "n": 200, "graderVersion": "1"
    }  # fmt: skip


async def test_the_poller_cancels_a_job_past_its_timeout_and_grace(world: World) -> None:
    await started(world)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    job_id = world.backend.only_job()
    begun = world.clock()
    world.backend.set_stage(job_id, RemoteStatus("running", started_at=begun, raw_stage="RUNNING"))
    world.clock.advance(600 + 60)  # timeout and grace, not past them
    await world.poll()
    assert world.status("agentjobs", "j1")["phase"] == "Running"

    world.clock.advance(1)
    await world.poll()
    status = world.status("agentjobs", "j1")
    assert (status["phase"], status["reason"]) == ("Cancelled", cond.DEADLINE_EXCEEDED)
    assert "exitCode" not in status  # the backend reported none
    assert world.backend.jobs[job_id].status.stage == "cancelled"
    assert world.ledger()["reservedMicroUSD"] == 0


async def test_an_unconfirmed_cancellation_is_retried_with_backoff_until_confirmed(world: World) -> None:
    await started(world)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    world.backend.confirm_cancel = False

    assert not await cancel_agentjob(world.ctx, NS, "j1", cond.EPISODE_ENDED, "test")
    assert world.status("agentjobs", "j1")["phase"] == "Orphaned"
    (orphan,) = world.status("episodes", "ep")["orphanedJobs"]
    assert orphan["attempts"] == 1
    assert orphan["nextAttemptAt"] == format_time(world.clock() + timedelta(seconds=5))
    assert world.ledger()["reservedMicroUSD"] == CPU_BASIC * 10  # it may still bill

    cancels = world.backend.stats.calls["cancel"]
    await collect_orphans(world.ctx, NS, "ep")  # not due yet
    assert world.backend.stats.calls["cancel"] == cancels

    world.clock.advance(5)
    await collect_orphans(world.ctx, NS, "ep")
    (orphan,) = world.status("episodes", "ep")["orphanedJobs"]
    assert orphan["attempts"] == 2
    assert orphan["nextAttemptAt"] == format_time(world.clock() + timedelta(seconds=10))
    assert world.backend.stats.calls["cancel"] == cancels + 1

    world.backend.confirm_cancel = True
    world.clock.advance(10)
    await collect_orphans(world.ctx, NS, "ep")
    episode = world.status("episodes", "ep")
    assert episode["orphanedJobs"] == []
    orphaned = next(c for c in episode["conditions"] if c["type"] == cond.ORPHANED)
    assert orphaned["status"] == "False"
    assert world.status("agentjobs", "j1")["phase"] == "Cancelled"
    assert world.ledger()["reservedMicroUSD"] == 0


async def test_an_episode_start_writes_its_status_once(world: World) -> None:
    world.episode()
    world.api.reset_calls()
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    assert status["phase"] == "Running" and status["ledger"]["budgetMicroUSD"] == 1_000_000
    assert status["deadline"] == format_time(world.clock() + timedelta(seconds=1200))
    assert world.api.calls["replace_namespaced_custom_object_status"] == 1
    # The Episode and its namespace's quota (none); the write reuses the pass's read.
    assert world.api.calls["get_namespaced_custom_object"] == 2


async def test_the_watch_copy_only_hints_and_a_stale_one_submits_nothing(world: World) -> None:
    await started(world)
    world.job()
    as_created = world.api.obj("agentjobs", NS, "j1")
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1", observed=as_created)
    assert world.status("agentjobs", "j1")["phase"] == "Running"
    assert world.api.calls["get_namespaced_custom_object"] == 3  # the job, its quota, its Episode

    # kopf retries with the copy it had: the fresh read shows the job Running, so nothing happens.
    world.api.reset_calls()
    await reconcile_agentjob(world.ctx, NS, "j1", observed=as_created)
    assert world.backend.stats.calls["submit"] == 1 and world.api.writes() == 0


class ReleasingBackend(FakeBackend):
    """A backend with per-episode resources that take a while to go (a namespace terminating)."""

    name = "pods"

    def __init__(self) -> None:
        super().__init__()
        self.release_calls: list[tuple[str, str]] = []
        self.gone_after = 2

    async def release_episode(self, namespace: str, episode: str) -> bool:
        self.release_calls.append((namespace, episode))
        return len(self.release_calls) >= self.gone_after


async def test_an_ended_episode_releases_its_backend_resources_until_confirmed_gone(world: World) -> None:
    """Also what a restarted operator does: it reads the ended Episode and finishes the release."""
    backend = ReleasingBackend()
    world.ctx.backends["pods"] = backend
    world.episode(backend="pods")
    world.api.objects[("episodes", NS, "ep")]["status"] = {
        "phase": "Completed",
        "outcome": "Scored",
        "reward": "1",
    }
    await reconcile_episode(world.ctx, NS, "ep")  # still terminating: nothing recorded
    assert backend.release_calls == [(NS, "ep")]
    assert "backendReleased" not in world.status("episodes", "ep")
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    assert world.status("episodes", "ep")["backendReleased"] is True
    # Released: later passes are idle and call nothing.
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    assert len(backend.release_calls) == 2


async def test_an_episode_with_unsettled_jobs_is_not_released(world: World) -> None:
    backend = ReleasingBackend()
    world.ctx.backends["pods"] = backend
    world.episode(backend="pods")
    world.api.objects[("episodes", NS, "ep")]["status"] = {
        "phase": "Completed",
        "ledger": {"entries": {"j1": {"reservedMicroUSD": 100}}},
    }
    world.job("j1")
    await reconcile_episode(world.ctx, NS, "ep")
    assert backend.release_calls == []


def _recorded(world: World) -> list[tuple[str, str, str, str]]:
    """The Events the reconcilers post, as (object, type, reason, message)."""
    events: list[tuple[str, str, str, str]] = []
    world.ctx.emit = lambda body, type_, reason, message: events.append(
        (body["metadata"]["name"], type_, reason, message)
    )
    return events


async def _delete_unsettled(world: World, name: str) -> None:
    """What a user does who removes the operator's finalizer by hand and deletes the job: it is gone
    at once, and no delete handler ever settles it (the fake keeps no finalizers)."""
    await world.api.delete_namespaced_custom_object("posttrain.dev", "v1alpha1", NS, "agentjobs", name)
    assert ("agentjobs", NS, name) not in world.api.objects


async def test_an_ended_episode_settles_a_job_deleted_unsettled_at_its_reservation_then_releases(
    world: World,
) -> None:
    backend = ReleasingBackend()
    backend.gone_after = 1
    world.ctx.backends["pods"] = backend
    events = _recorded(world)
    await started(world, backend="pods", limits={"maxSteps": 1})
    for name in ("j1", "j2"):
        world.job(name)
        await reconcile_agentjob(world.ctx, NS, name)
    await _delete_unsettled(world, "j1")
    world.api.objects[("episodes", NS, "ep")]["status"]["steps"] = 1
    await reconcile_episode(world.ctx, NS, "ep")  # the step limit: ended, and j2 cancelled
    assert world.status("episodes", "ep")["phase"] == "Completed"
    reserved = CPU_BASIC * 10
    assert world.ledger()["entries"]["j1"] == {"reservedMicroUSD": reserved, "platform": False}

    world.api.reset_calls()
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    ledger = world.ledger()
    assert ledger["entries"]["j1"]["settledMicroUSD"] == reserved  # its worst case: its minutes are unknown
    # The job that existed was cancelled, at what the backend reported (the fake's cancel bills nothing).
    assert ledger["entries"]["j2"]["settledMicroUSD"] == 0
    assert (ledger["reservedMicroUSD"], ledger["settledMicroUSD"]) == (0, reserved)
    assert world.api.calls["replace_namespaced_custom_object_status"] == 1  # one ledger write
    (warning,) = [e for e in events if e[2] == "SettledAtReservation"]
    assert warning[:2] == ("ep", "Warning") and "j1" in warning[3] and "j2" not in warning[3]

    # Nothing is left unsettled: the next pass releases the episode's namespace.
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    assert world.status("episodes", "ep")["backendReleased"] is True
    # Its provenance holds j2 (j1 went past the operator, so only the ledger knows it), and no tool call
    # for the step set by hand: the summary waits for the gateway's record until the grace has passed,
    # and then says what it holds.
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    assert "provenance" not in world.status("episodes", "ep")
    world.clock.advance(world.ctx.settings.provenance_grace_seconds)
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    summary = world.status("episodes", "ep")["provenance"]
    assert (summary["toolCalls"], summary["jobs"], summary["chain"]) == (0, 1, "intact")
    world.api.reset_calls()
    await reconcile_episode(world.ctx, NS, "ep", world.api.obj("episodes", NS, "ep"))
    assert world.api.calls == {}


async def test_settling_vanished_jobs_is_idempotent_and_decided_on_the_status_it_swaps(world: World) -> None:
    """An Episode recorded as ended by an operator that died before cancelling anything: a second pass
    (a stale copy, or a second reconcile racing the first) settles nothing twice and says nothing twice."""
    events = _recorded(world)
    await started(world)
    for name in ("j1", "j2"):
        world.job(name)
        await reconcile_agentjob(world.ctx, NS, name)
    world.api.objects[("episodes", NS, "ep")]["status"]["phase"] = "Completed"
    await _delete_unsettled(world, "j1")
    stale = world.api.obj("episodes", NS, "ep")

    await settle_ended(world.ctx, stale)
    once = world.ledger()
    assert once["entries"]["j1"]["settledMicroUSD"] == CPU_BASIC * 10
    assert once["entries"]["j2"]["settledMicroUSD"] == 0  # cancelled before it started: its minutes
    assert world.status("agentjobs", "j2")["phase"] == "Cancelled"

    world.api.reset_calls()
    await settle_ended(world.ctx, stale)  # its copy predates the first settlement: one 409, then nothing
    assert world.ledger() == once
    assert world.api.calls["replace_namespaced_custom_object_status"] == 1
    assert world.api.writes() == 1
    assert [e[2] for e in events].count("SettledAtReservation") == 1
    assert world.backend.stats.calls["cancel"] == 1


async def test_an_orphan_deleted_unsettled_is_cancelled_by_its_recorded_id_then_settled_at_its_reservation(
    world: World,
) -> None:
    events = _recorded(world)
    await started(world)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    job_id = world.backend.only_job()
    world.backend.confirm_cancel = False
    assert not await cancel_agentjob(world.ctx, NS, "j1", cond.EPISODE_ENDED, "test")
    await _delete_unsettled(world, "j1")

    world.clock.advance(5)
    await collect_orphans(world.ctx, NS, "ep")  # the job is gone, its backend job is not: still orphaned
    (orphan,) = world.status("episodes", "ep")["orphanedJobs"]
    assert (orphan["name"], orphan["attempts"]) == ("j1", 2)
    assert world.backend.stats.calls["cancel"] == 2  # by the id the Episode recorded
    assert "settledMicroUSD" not in world.ledger()["entries"]["j1"]

    world.backend.confirm_cancel = True
    world.clock.advance(10)
    await collect_orphans(world.ctx, NS, "ep")
    episode = world.status("episodes", "ep")
    assert world.backend.jobs[job_id].status.stage == "cancelled"
    assert episode["orphanedJobs"] == []
    assert next(c for c in episode["conditions"] if c["type"] == cond.ORPHANED)["status"] == "False"
    reserved = CPU_BASIC * 10
    assert episode["ledger"]["entries"]["j1"]["settledMicroUSD"] == reserved  # its flavor went with it
    assert (episode["ledger"]["reservedMicroUSD"], episode["ledger"]["settledMicroUSD"]) == (0, reserved)
    assert [e[2] for e in events].count("OrphanCollected") == 1
    assert [e[:3] for e in events if e[2] == "SettledAtReservation"] == [
        ("ep", "Warning", "SettledAtReservation")
    ]

    world.api.reset_calls()
    await collect_orphans(world.ctx, NS, "ep")  # nothing is left to collect
    assert world.api.writes() == 0 and world.backend.stats.calls["cancel"] == 3


@pytest.mark.parametrize("loopback", [False, True])
async def test_a_task_needing_loopback_starts_only_where_the_backend_gives_it(
    world: World, monkeypatch: pytest.MonkeyPatch, loopback: bool
) -> None:
    from posttrain_operator.reconcile import episode

    from graders.tasks import get_task

    needing = get_task("t0_artifact").model_copy(update={"requires_loopback": True})
    monkeypatch.setattr(episode, "get_task", lambda _name: needing)
    world.ctx.settings.hf_jobs_loopback = loopback
    world.episode()
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    if not loopback:
        assert (status["phase"], status["conditions"][-1]["reason"]) == ("Failed", "NetworkUnavailable")
        assert (
            "t0_artifact's jobs need loopback networking; hf-jobs: HF Jobs gives a job the network"
            in (status["message"])
        )
        return
    assert status["phase"] == "Running" and status["network"]["mode"] == "loopback"


@pytest.mark.parametrize("loopback", [False, True])
async def test_an_agent_jobs_network_mode_is_recorded_and_sent_to_its_launcher(
    world: World, loopback: bool
) -> None:
    world.ctx.settings.hf_jobs_loopback = loopback
    await started(world)
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    mode = "loopback" if loopback else "unix"
    assert world.status("agentjobs", "j1")["network"] == mode
    assert world.status("episodes", "ep")["network"]["mode"] == mode
    (submitted,) = world.backend.jobs.values()
    assert submitted.request.launcher_spec["network"] == mode


@pytest.mark.parametrize("profile", [None, "posttrain-loopback.json"])
def test_pods_jobs_get_loopback_only_where_the_nodes_have_its_seccomp_profile(
    world: World, profile: str | None
) -> None:
    world.ctx.settings.pods_loopback_seccomp_profile = profile
    network = world.ctx.job_network("pods")
    if profile is None:
        assert network.mode == "unix" and "pods.loopbackSeccompProfile" in network.reason
        return
    assert network.mode == "loopback"
    assert "makes a user and network namespace holding lo alone" in network.reason
    assert profile in network.reason
    assert world.ctx.job_network("hf-jobs").mode == "unix"  # the other backend is unchanged


@pytest.mark.parametrize(
    ("backend", "grader_flavor", "refused"),
    [("hf-jobs", None, "flavor(s) cpu-basic do not"), ("pods", None, None), ("pods", "cpu-runc", "cpu-runc")],
)
async def test_a_task_needing_a_sandbox_starts_only_where_every_flavor_it_uses_has_one(
    world: World,
    monkeypatch: pytest.MonkeyPatch,
    backend: str,
    grader_flavor: str | None,
    refused: str | None,
) -> None:
    from posttrain_operator.config import PodFlavor
    from posttrain_operator.reconcile import episode

    from graders.tasks import get_task

    needing = get_task("t0_artifact").model_copy(
        update={"requires_sandbox": True, "default_flavors": ["cpu-basic"], "grader_flavor": grader_flavor}
    )
    monkeypatch.setattr(episode, "get_task", lambda _name: needing)
    world.ctx.backends["pods"] = world.backend
    world.ctx.settings.pods_flavors = {
        "cpu-basic": PodFlavor(runtime_class_name="gvisor"),
        "cpu-runc": PodFlavor(),
        "gpu-nvidia": PodFlavor(runtime_class_name="nvidia"),  # a RuntimeClass that sandboxes nothing
    }
    assert world.ctx.sandboxed_flavors("pods") == {"cpu-basic"}
    assert world.ctx.sandboxed_flavors("hf-jobs") == set()
    world.episode(backend=backend)
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    if refused is None:
        assert status["phase"] == "Running", status
        return
    assert (status["phase"], status["conditions"][-1]["reason"]) == ("Failed", "SandboxUnavailable")
    assert f"t0_artifact's jobs must run under a sandboxing runtime; on {backend}" in status["message"]
    assert refused in status["message"] and "pods.sandboxRuntimeClasses: gvisor" in status["message"]


@pytest.mark.parametrize("mapped", [False, True])
async def test_a_task_in_an_environment_image_runs_only_where_the_operator_has_that_image(
    world: World, mapped: bool
) -> None:
    if mapped:
        world.ctx.settings.environment_images = {"trl": "registry.example/posttrain-env-trl:1"}
    world.episode(task="t0_arithmetic_format_trl")
    await reconcile_episode(world.ctx, NS, "ep")
    status = world.status("episodes", "ep")
    if not mapped:
        assert (status["phase"], status["conditions"][-1]["reason"]) == ("Failed", "EnvironmentUnavailable")
        assert "environment image(s) trl, which this operator has no image for" in status["message"]
        return
    assert status["phase"] == "Running"
    world.job()
    await reconcile_agentjob(world.ctx, NS, "j1")
    (submitted,) = world.backend.jobs.values()
    assert submitted.request.image == "registry.example/posttrain-env-trl:1"


async def test_the_wheels_a_backend_resolved_are_recorded_in_the_jobs_status(world: World) -> None:
    await started(world)
    world.backend.resolved = (PackagePin("ptprobe", "1.0", "a" * 64), PackagePin("ptdep", "1.2", "b" * 64))
    world.job(packages=["ptprobe==1.0"])
    await reconcile_agentjob(world.ctx, NS, "j1")
    assert world.status("agentjobs", "j1")["packages"] == [
        {"name": "ptprobe", "version": "1.0", "sha256": "a" * 64},
        {"name": "ptdep", "version": "1.2", "sha256": "b" * 64},
    ]
