"""Bad input is refused by the API server itself, with a clear message, and changes nothing."""

from __future__ import annotations

import json

import pytest
from posttrain_operator.api.models import MAX_PACKAGES, MAX_SCRIPT_BYTES

from tests.helpers import Kubectl, kubectl_json
from tests.integration.support import agentjob_manifest, episode_manifest


def _create(kubectl: Kubectl, namespace: str, manifest: dict) -> str:
    result = kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(manifest), check=False)
    assert result.returncode != 0, f"{manifest['metadata']['name']} was accepted"
    return result.stderr


def _count(kubectl: Kubectl, namespace: str, kind: str) -> int:
    return len(kubectl_json(kubectl, "-n", namespace, "get", kind)["items"])


@pytest.mark.parametrize(
    ("budget", "why"),
    [
        ("-1", "negative"),
        ("1.2.3", "malformed"),
        ("ten", "not a number"),
        ("0.1234567", "sub-micro"),
        ("", "empty"),
    ],
    ids=lambda v: str(v),
)
def test_bad_budget_is_refused(kubectl: Kubectl, namespace: str, crds: None, budget: str, why: str) -> None:
    stderr = _create(kubectl, namespace, episode_manifest("bad", budget=budget))
    assert "spec.budgetUSD" in stderr, why
    assert _count(kubectl, namespace, "episodes") == 0


def test_unknown_backend_is_refused(kubectl: Kubectl, namespace: str, crds: None) -> None:
    stderr = _create(kubectl, namespace, episode_manifest("bad", backend="slurm"))
    assert "spec.backend" in stderr and 'supported values: "hf-jobs", "pods"' in stderr
    assert _count(kubectl, namespace, "episodes") == 0


def test_oversize_script_is_refused(kubectl: Kubectl, namespace: str, crds: None) -> None:
    stderr = _create(kubectl, namespace, agentjob_manifest("big", "ep", script="#" * (MAX_SCRIPT_BYTES + 1)))
    assert "spec.script" in stderr and f"may not be more than {MAX_SCRIPT_BYTES} bytes" in stderr
    assert _count(kubectl, namespace, "agentjobs") == 0


def test_the_script_limit_is_counted_in_bytes(kubectl: Kubectl, namespace: str, crds: None) -> None:
    """262,144 'é' are within maxLength (characters) but twice the limit in bytes."""
    heavy = "é" * MAX_SCRIPT_BYTES
    stderr = _create(kubectl, namespace, agentjob_manifest("wide", "ep", script=heavy))
    assert "spec.script" in stderr and f"larger than {MAX_SCRIPT_BYTES} bytes (UTF-8)" in stderr, stderr
    assert _count(kubectl, namespace, "agentjobs") == 0
    at_limit = agentjob_manifest("fits", "ep", script="é" * (MAX_SCRIPT_BYTES // 2))
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(at_limit))
    assert _count(kubectl, namespace, "agentjobs") == 1


def test_too_many_packages_are_refused(kubectl: Kubectl, namespace: str, crds: None) -> None:
    packages = [f"pkg{i}==1.0" for i in range(MAX_PACKAGES + 1)]
    stderr = _create(kubectl, namespace, agentjob_manifest("many", "ep", packages=packages))
    assert "spec.packages" in stderr and f"must have at most {MAX_PACKAGES} items" in stderr
    assert _count(kubectl, namespace, "agentjobs") == 0


def _patch(kubectl: Kubectl, namespace: str, kind: str, name: str, patch: dict) -> str:
    result = kubectl(
        "-n", namespace, "patch", kind, name, "--type=merge", "-p", json.dumps(patch), check=False
    )
    assert result.returncode != 0, f"patch {patch} was accepted"
    return result.stderr


def test_task_budget_and_backend_are_immutable(kubectl: Kubectl, namespace: str, crds: None) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(episode_manifest("ep")))
    before = kubectl_json(kubectl, "-n", namespace, "get", "episode", "ep")
    assert "spec.task is immutable" in _patch(
        kubectl, namespace, "episode", "ep", {"spec": {"task": "t0_arithmetic_format"}}
    )
    assert "spec.budgetUSD is immutable" in _patch(
        kubectl, namespace, "episode", "ep", {"spec": {"budgetUSD": "99"}}
    )
    assert "spec.backend is immutable" in _patch(
        kubectl, namespace, "episode", "ep", {"spec": {"backend": "pods"}}
    )
    after = kubectl_json(kubectl, "-n", namespace, "get", "episode", "ep")
    assert after["spec"] == before["spec"]
    assert after["metadata"]["generation"] == before["metadata"]["generation"]


def _set_phase(kubectl: Kubectl, namespace: str, phase: str) -> None:
    status = json.dumps({"status": {"phase": phase}})
    kubectl("-n", namespace, "patch", "episode", "ep", "--subresource=status", "--type=merge", "-p", status)


def test_submission_is_taken_only_while_the_episode_runs(
    kubectl: Kubectl, namespace: str, crds: None
) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(episode_manifest("ep")))
    submission = {"spec": {"submission": {"checkpointFrom": "job-a"}}}
    for phase in (None, "Pending", "Completed", "Failed"):
        if phase is not None:
            _set_phase(kubectl, namespace, phase)
        refused = _patch(kubectl, namespace, "episode", "ep", submission)
        assert "spec.submission can be set only while the Episode is Running" in refused, phase
        assert "submission" not in kubectl_json(kubectl, "-n", namespace, "get", "episode", "ep")["spec"]
    # The end written after a submission landed (the status subresource) is taken as before.
    _set_phase(kubectl, namespace, "Running")
    kubectl("-n", namespace, "patch", "episode", "ep", "--type=merge", "-p", json.dumps(submission))
    _set_phase(kubectl, namespace, "Completed")
    assert kubectl_json(kubectl, "-n", namespace, "get", "episode", "ep")["status"]["phase"] == "Completed"


def test_submission_is_set_once(kubectl: Kubectl, namespace: str, crds: None) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(episode_manifest("ep")))
    _set_phase(kubectl, namespace, "Running")
    first = {"spec": {"submission": {"checkpointFrom": "job-a"}}}
    kubectl("-n", namespace, "patch", "episode", "ep", "--type=merge", "-p", json.dumps(first))
    second = {"spec": {"submission": {"checkpointFrom": "job-b"}}}
    assert "spec.submission is set once" in _patch(kubectl, namespace, "episode", "ep", second)
    removed = kubectl(
        "-n", namespace, "patch", "episode", "ep", "--type=json",
        "-p", '[{"op":"remove","path":"/spec/submission"}]', check=False,
    )  # fmt: skip
    assert removed.returncode != 0 and "spec.submission is set once" in removed.stderr
    spec = kubectl_json(kubectl, "-n", namespace, "get", "episode", "ep")["spec"]
    assert spec["submission"] == {"checkpointFrom": "job-a"}


def test_agentjob_spec_is_immutable(kubectl: Kubectl, namespace: str, crds: None) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(agentjob_manifest("j", "ep")))
    assert "AgentJob spec is immutable" in _patch(
        kubectl, namespace, "agentjob", "j", {"spec": {"timeoutSeconds": 900}}
    )


@pytest.mark.parametrize(
    ("name", "spec", "message"),
    [
        ("itself", {"inputsFrom": ["itself"]}, "spec.inputsFrom names the job itself"),
        ("dev", {"purpose": "devEval", "script": "", "checkpointFrom": "a", "inputsFrom": ["a"]},
         "spec.inputsFrom is for train jobs only"),
        ("twice", {"inputsFrom": ["a", "a"]}, 'spec.inputsFrom[1]: Duplicate value: "a"'),
        ("many", {"inputsFrom": [f"j{i}" for i in range(9)]}, "must have at most 8 items"),
        ("upper", {"inputsFrom": ["Not-A-Name"]}, "spec.inputsFrom[0]"),
    ],
    ids=["itself", "grader-job", "twice", "too-many", "bad-name"],
)  # fmt: skip
def test_inputs_from_that_cannot_be_right_is_refused_by_the_api_server(
    kubectl: Kubectl, namespace: str, crds: None, name: str, spec: dict, message: str
) -> None:
    stderr = _create(kubectl, namespace, agentjob_manifest(name, "ep", **spec))
    assert message in stderr, stderr
    assert _count(kubectl, namespace, "agentjobs") == 0
