"""What a platform team gets wrong in week one ends in a visible state within one reconcile, against
the real API server and the HF Jobs emulator: the condition and reason on the object, the Event a user
sees, the episode still ending at its deadline, readiness saying why, and no traceback loop in the log.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator, routes
from devstack.hf_emulator.repos import remove_tree
from tests.helpers import Kubectl, kubectl_json, wait_for
from tests.integration.support import (
    HF_TOKEN,
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    make_emulator,
    running_operator,
    wait_phase,
)

WRONG_TOKEN = "hf_revoked_token_abcdefghijklmnop"


def _condition(obj: dict[str, Any], type_: str) -> dict[str, Any]:
    found = [c for c in obj.get("status", {}).get("conditions", []) if c["type"] == type_]
    assert found, f"no {type_} condition in {obj.get('status')}"
    return found[0]


def _event_reasons(kubectl: Kubectl, namespace: str, name: str) -> list[str]:
    events = kubectl_json(
        kubectl, "-n", namespace, "get", "events", f"--field-selector=involvedObject.name={name}"
    )
    return [e["reason"] for e in events["items"]]


def _wait_event(kubectl: Kubectl, namespace: str, name: str, reason: str) -> None:
    wait_for(lambda: reason in _event_reasons(kubectl, namespace, name), what=f"a {reason} Event on {name}")


def _health(op: OperatorProcess) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(f"{op.broker_url}/healthz", timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _no_traceback_loop(op: OperatorProcess) -> None:
    assert op.logs().count("Traceback") == 0, op.logs()[-4000:]


def _kubectl_wait_ended(kubectl: Kubectl, namespace: str, name: str) -> None:
    """What the README shows: returns once the episode has ended, whatever its outcome."""
    kubectl("-n", namespace, "wait", "--for=condition=Ended", f"episode/{name}", "--timeout=50s")


@pytest.fixture
def op_env(request: pytest.FixtureRequest) -> dict[str, str]:
    return dict(getattr(request, "param", {}))


@pytest.fixture
def misconfigured(
    cluster: devcluster.ClusterState,
    crds: None,
    emulator: HfEmulator,
    tmp_path: Path,
    namespace: str,
    op_env: dict[str, str],
) -> Iterator[OperatorProcess]:
    with running_operator(cluster, emulator, tmp_path, namespace, **op_env) as op:
        op.wait_ready()
        yield op


def test_an_episode_on_a_backend_that_is_not_enabled_fails_at_once(
    kubectl: Kubectl, namespace: str, misconfigured: OperatorProcess
) -> None:
    apply(kubectl, namespace, episode_manifest("ep1", backend="pods"))
    _kubectl_wait_ended(kubectl, namespace, "ep1")
    episode = get(kubectl, namespace, "episode", "ep1")
    assert episode["status"]["phase"] == "Failed"
    assert "backend 'pods' is not enabled in this operator (enabled: hf-jobs)" in episode["status"]["message"]
    assert _condition(episode, "Ended")["reason"] == "BackendNotEnabled"
    _wait_event(kubectl, namespace, "ep1", "BackendNotEnabled")
    _no_traceback_loop(misconfigured)


@pytest.mark.parametrize(
    "op_env", [{"POSTTRAIN_HF_TOKEN": WRONG_TOKEN}], indirect=True, ids=["revoked-token"]
)
def test_a_rejected_token_is_reported_and_rejects_jobs_and_the_episode_still_ends(
    kubectl: Kubectl, namespace: str, misconfigured: OperatorProcess, emulator: HfEmulator
) -> None:
    status, body = _health(misconfigured)
    assert status == 503 and body["backends"]["hf-jobs"]["reason"] == "CredentialsRejected", body
    apply(kubectl, namespace, episode_manifest("ep1", limits={"maxWallSeconds": 15}))
    episode = wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    assert _condition(episode, "BackendReady")["reason"] == "CredentialsRejected"
    _wait_event(kubectl, namespace, "ep1", "CredentialsRejected")

    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Rejected"})
    assert job["status"]["reason"] == "CredentialsRejected"
    assert "refused the operator's token" in job["status"]["message"]
    assert _condition(job, "Finished")["status"] == "True"
    _wait_event(kubectl, namespace, "job1", "CredentialsRejected")

    _kubectl_wait_ended(kubectl, namespace, "ep1")
    assert get(kubectl, namespace, "episode", "ep1")["status"]["outcome"] == "LimitReached"
    assert emulator.request_count(routes.CREATE_JOB) == 0
    logs = misconfigured.logs()
    assert WRONG_TOKEN not in logs and WRONG_TOKEN[3:] not in logs
    assert "CredentialsRejected" in logs
    _no_traceback_loop(misconfigured)


@pytest.mark.parametrize(
    "op_env", [{"POSTTRAIN_HF_JOBS_ENABLED": "true", "POSTTRAIN_HF_TOKEN": "",
                "POSTTRAIN_HF_TOKEN_SOURCE": "Secret posttrain-system/hf-token, key token"}],
    indirect=True, ids=["secret-missing"],
)  # fmt: skip
def test_a_missing_token_secret_is_reported_with_its_name(
    kubectl: Kubectl, namespace: str, misconfigured: OperatorProcess, emulator: HfEmulator
) -> None:
    status, body = _health(misconfigured)
    assert status == 503 and body["backends"]["hf-jobs"]["reason"] == "CredentialsMissing", body
    assert "hf-token, key token" in body["backends"]["hf-jobs"]["message"]
    apply(kubectl, namespace, episode_manifest("ep1"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Rejected"})
    assert job["status"]["reason"] == "CredentialsMissing" and "hf-token" in job["status"]["message"]
    _wait_event(kubectl, namespace, "job1", "CredentialsMissing")
    assert emulator.request_count(routes.CREATE_JOB) == 0
    _no_traceback_loop(misconfigured)


def test_an_unreachable_backend_leaves_the_job_pending_with_a_reason_and_the_episode_ends(
    kubectl: Kubectl, namespace: str, misconfigured: OperatorProcess, emulator: HfEmulator
) -> None:
    emulator.controls.inject("http_error", route=routes.HARDWARE, status=503, count=None)
    apply(kubectl, namespace, episode_manifest("ep1", limits={"maxWallSeconds": 30}))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))

    def waiting() -> dict[str, Any] | None:
        job = get(kubectl, namespace, "agentjob", "job1")
        return job if job.get("status", {}).get("reason") == "BackendUnreachable" else None

    job = wait_for(waiting, timeout=90, what="job1 to say the backend is unreachable")
    assert job["status"]["phase"] == "Pending"
    assert _condition(job, "Admitted")["status"] == "False"
    _wait_event(kubectl, namespace, "job1", "BackendUnreachable")

    _kubectl_wait_ended(kubectl, namespace, "ep1")
    assert get(kubectl, namespace, "episode", "ep1")["status"]["outcome"] == "LimitReached"
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Cancelled"})
    assert emulator.request_count(routes.CREATE_JOB) == 0
    # Retried with backoff: one Event, however many retries.
    assert _event_reasons(kubectl, namespace, "job1").count("BackendUnreachable") == 1
    _no_traceback_loop(misconfigured)


def test_a_missing_task_asset_fails_the_job_naming_it(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    bare, bare_dir = make_emulator(execute=False, simulated_runtime=1.0)  # no repository registered
    try:
        with running_operator(cluster, bare, tmp_path, namespace) as op:
            apply(kubectl, namespace, episode_manifest("ep1"))
            wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
            apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
            job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Failed"}, timeout=90)
            assert job["status"]["reason"] == "JobFailed"
            assert "is not registered" in job["status"]["message"], job["status"]["message"]
            assert _condition(job, "Finished")["status"] == "True"
            _wait_event(kubectl, namespace, "job1", "JobFailed")
            _no_traceback_loop(op)
    finally:
        bare.stop()
        remove_tree(bare_dir)
    assert HF_TOKEN not in op.logs()
