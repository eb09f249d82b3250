"""An ended Episode's backend resources (the pods backend's namespace, whose pods' finalizers hold
their final statuses) go only once every job is settled, the orphaned ones included."""

from __future__ import annotations

from posttrain_operator.reconcile.episode import reconcile_episode

from tests.unit.operator.test_reconcilers import NS, ReleasingBackend, make_world


async def test_an_ended_episode_is_released_only_once_its_orphans_are_collected() -> None:
    """The pods soak's seed 2: an Episode whose one unsettled job was Orphaned (its kubelet restarting,
    the cancel unconfirmed) had its namespace released; its pod went with it, and the orphan's
    collection then found the pod gone and settled a job that had run at nothing."""
    world = make_world()
    backend = ReleasingBackend()
    backend.gone_after = 1
    world.ctx.backends["pods"] = backend
    world.episode(backend="pods")
    world.job("j1")
    orphan = {"name": "j1", "backendJobId": "pt-ns/job-pod", "nextAttemptAt": "2999-01-01T00:00:00Z"}
    world.api.objects[("episodes", NS, "ep")]["status"] = {
        "phase": "Completed",
        "ledger": {"entries": {"j1": {"reservedMicroUSD": 100}}, "reservedMicroUSD": 100},
        "orphanedJobs": [orphan],
    }
    await reconcile_episode(world.ctx, NS, "ep")
    assert backend.release_calls == []

    # Collected: the job settled from its pod's final status and off the list; now it goes.
    status = world.api.objects[("episodes", NS, "ep")]["status"]
    status["ledger"] = {"entries": {"j1": {"reservedMicroUSD": 100, "settledMicroUSD": 100}}}
    status["orphanedJobs"] = []
    await reconcile_episode(world.ctx, NS, "ep")
    assert backend.release_calls == [(NS, "ep")]
    assert world.status("episodes", "ep")["backendReleased"] is True
