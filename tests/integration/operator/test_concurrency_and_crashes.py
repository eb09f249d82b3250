"""The ledger under concurrency and crashes: the invariant holds in every status a watch sees, no
backend job is ever submitted twice, none is lost, and the books match what the backend billed."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml
from posttrain_operator.backends.hf_client import KEY_LABEL

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator, routes
from tests.helpers import Kubectl, kubectl_json, wait_for
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    running_operator,
    wait_phase,
)
from tests.integration.watching import ObjectWatch

CPU_BASIC = 167  # micro-dollars per minute
IN_FLIGHT = "an earlier submission may still be in flight"
TERMINAL = {"Succeeded", "Failed", "Cancelled", "Rejected"}


def _all_terminal(kubectl: Kubectl, namespace: str, count: int) -> list[dict[str, Any]] | None:
    jobs: list[dict[str, Any]] = kubectl_json(kubectl, "-n", namespace, "get", "agentjobs")["items"]
    done = [j for j in jobs if j.get("status", {}).get("phase") in TERMINAL]
    return jobs if len(jobs) == count and len(done) == count else None


def _assert_books_match_backend(
    episode: dict[str, Any], jobs: list[dict[str, Any]], emulator: HfEmulator
) -> None:
    ledger = episode["status"]["ledger"]
    billed = {r.job_id: r.cost_micro_usd for r in emulator.billing()}
    assert ledger["reservedMicroUSD"] == 0
    assert ledger["settledMicroUSD"] == sum(billed.values()) == emulator.total_cost_micro_usd()
    for job in jobs:
        backend_id = job["status"].get("backendJobId")
        assert job["status"]["settledMicroUSD"] == (billed[backend_id] if backend_id else 0)


def test_fifty_jobs_at_once_never_overspend(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    namespace: str,
    operator: OperatorProcess,
    emulator: HfEmulator,
) -> None:
    admits_at_most = 7
    # A 60 s cpu-basic job reserves one minute; every job bills at least one minute.
    budget = f"0.{admits_at_most * CPU_BASIC:06d}"
    apply(kubectl, namespace, episode_manifest("ep1", budget=budget, limits={"maxConcurrentJobs": 100}))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    watch = ObjectWatch(cluster, namespace, "episode", "ep1")

    jobs = [agentjob_manifest(f"j{i:02d}", "ep1", timeoutSeconds=60) for i in range(50)]
    kubectl("-n", namespace, "create", "-f", "-", input=yaml.safe_dump_all(jobs))
    final_jobs = wait_for(
        lambda: _all_terminal(kubectl, namespace, 50), timeout=120, what="all 50 jobs to finish"
    )
    wait_for(lambda: get(kubectl, namespace, "episode", "ep1")["status"]["ledger"]["reservedMicroUSD"] == 0)
    versions = watch.stop(kubectl)

    phases = Counter(j["status"]["phase"] for j in final_jobs)
    assert phases["Succeeded"] == admits_at_most, phases
    assert phases["Rejected"] == 50 - admits_at_most, phases
    assert {j["status"]["reason"] for j in final_jobs if j["status"]["phase"] == "Rejected"} == {
        "BudgetExceeded"
    }
    assert len(emulator.job_ids()) == admits_at_most
    assert len(versions) > admits_at_most  # the watch saw the ledger move
    for version in versions:
        ledger = version.get("status", {}).get("ledger", {})
        if ledger:
            assert ledger["reservedMicroUSD"] + ledger["settledMicroUSD"] <= ledger["budgetMicroUSD"], ledger
    _assert_books_match_backend(get(kubectl, namespace, "episode", "ep1"), final_jobs, emulator)


@pytest.mark.slow
def test_sigkill_during_submissions_never_submits_twice(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, namespace: str, emulator: HfEmulator,
    tmp_path: Path,
) -> None:  # fmt: skip
    kills, per_round = 20, 3
    # A long HTTP timeout makes the in-flight window (timeout + margin) far longer than a restart,
    # however loaded the machine: the restarted operator must wait the held request out, never
    # submit again. It looks for the job every second meanwhile, so rounds stay short.
    slow_http = {"POSTTRAIN_HF_HTTP_TIMEOUT_SECONDS": "120", "POSTTRAIN_SUBMISSION_RECHECK_SECONDS": "1"}
    with running_operator(cluster, emulator, tmp_path, namespace, **slow_http) as operator:
        apply(kubectl, namespace, episode_manifest("ep1", budget="5.00", limits={"maxConcurrentJobs": 200}))
        wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
        for round_ in range(kills):
            # The round's first job creation is held by the emulator (received, not yet processed):
            # the kill lands while a submission is in flight by construction, not by timing.
            emulator.controls.inject("hang", route=routes.CREATE_JOB, count=1, seconds=600)
            # Timeouts far past a round: on a loaded machine a round's kill, restart and wait outlasted
            # 60 s, and 2 of 60 jobs ended Cancelled, most likely at their deadline (the operator's to keep).
            batch = [
                agentjob_manifest(f"r{round_:02d}-{i}", "ep1", timeoutSeconds=600) for i in range(per_round)
            ]
            operator.wait_ready()
            kubectl("-n", namespace, "create", "-f", "-", input=yaml.safe_dump_all(batch))
            emulator.controls.wait_held(routes.CREATE_JOB, timeout=120)
            operator.kill()
            operator.start()
            # The new process finds the key but no job, and waits instead of submitting again...
            wait_for(
                lambda: IN_FLIGHT in operator.current_log(),
                timeout=120,
                what="the restarted operator to wait out the submission in flight",
            )
            # ...then the held request is processed, and the new process adopts the job it created.
            emulator.controls.release_hangs()

        total = kills * per_round
        jobs = wait_for(
            lambda: _all_terminal(kubectl, namespace, total), timeout=300, what="every job to finish"
        )
        assert Counter(j["status"]["phase"] for j in jobs) == {"Succeeded": total}
        creations = emulator.creations_by_label(KEY_LABEL)
        assert len(creations) == total, "a job was lost or an unknown job was created"
        assert set(creations.values()) == {1}, {k: n for k, n in creations.items() if n != 1}
        assert {f"aj-{j['metadata']['uid']}" for j in jobs} == set(creations)
        assert operator.starts == kills + 1
        logs = operator.logs()
        assert logs.count(IN_FLIGHT) >= kills
        assert "by its key; not submitting again" in logs, "no restart adopted a job submitted before a kill"
        episode = wait_for(
            lambda: (e := get(kubectl, namespace, "episode", "ep1"))["status"]["ledger"]["reservedMicroUSD"]
            == 0
            and e
        )
        _assert_books_match_backend(episode, jobs, emulator)
