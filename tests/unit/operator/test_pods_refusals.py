"""Which refusals of the API server the pods backend waits out (transient) and which fail the job."""

from __future__ import annotations

import json

import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator.backends.pods.kube_calls import _api_error


def refusal(status: int, message: str) -> ApiException:
    exc = ApiException(status=status, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "message": message})
    return exc


@pytest.mark.parametrize(
    "message",
    [
        # A new episode namespace before the controller-manager made its ServiceAccount: the chaos
        # soak on kind met it right after a kube-apiserver restart, and the job failed for good.
        'pods "job-aj-a9a61df2" is forbidden: error looking up service account '
        'pt-posttrain-soak-s1-ep012-01d654a4f0/default: serviceaccount "default" not found',
        'pods "job-aj-1" is forbidden: unable to create new content in namespace pt-x because it is '
        "being terminated",
    ],
)
def test_a_refusal_that_passes_is_transient(message: str) -> None:
    error = _api_error("create_namespaced_pod", refusal(403, message))
    assert error.transient, error


@pytest.mark.parametrize(
    "message",
    [
        'pods "job-aj-1" is forbidden: violates PodSecurity "restricted:latest": privileged',
        'pods "job-aj-1" is forbidden: exceeded quota: compute, requested: cpu=1, used: cpu=4, '
        "limited: cpu=4",
    ],
)
def test_a_refusal_that_stays_fails_the_job(message: str) -> None:
    assert not _api_error("create_namespaced_pod", refusal(403, message)).transient
