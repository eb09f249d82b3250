"""Credentials that expire keep working: the operator runs with a ServiceAccount token read from a
kubeconfig `tokenFile`; the token is replaced by a new one and the old one revoked (its bound Secret
deleted, which the API server treats as expiry); the operator goes on reconciling with no 401."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devstack import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.conftest import Kubectl
from tests.helpers import wait_for
from tests.integration.conftest import (
    agentjob_manifest,
    apply,
    episode_manifest,
    running_operator,
    wait_phase,
)

SA = "rotating-operator"


def _token(kubectl: Kubectl, namespace: str, secret: str) -> str:
    """A token bound to a Secret: deleting the Secret revokes it at once (expiry without waiting)."""
    kubectl("-n", namespace, "create", "secret", "generic", secret, "--from-literal=k=v")
    return kubectl(
        "-n", namespace, "create", "token", SA, "--bound-object-kind=Secret", f"--bound-object-name={secret}",
        "--duration=1h",
    ).stdout.strip()  # fmt: skip


def _rejected(cluster: devcluster.ClusterState, kubectl: Kubectl, token: str) -> bool:
    proc = kubectl("get", "--raw", "/api", f"--token={token}", "--kubeconfig=/dev/null",
                   f"--server={_server(cluster)}", "--insecure-skip-tls-verify", check=False)  # fmt: skip
    return proc.returncode != 0 and "Unauthorized" in proc.stderr


def _server(cluster: devcluster.ClusterState) -> str:
    server: str = yaml.safe_load(Path(cluster.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
    return server


@pytest.fixture
def admin_sa(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    binding = f"{namespace}-{SA}"
    kubectl("-n", namespace, "create", "serviceaccount", SA)
    kubectl("create", "clusterrolebinding", binding, "--clusterrole=cluster-admin",
            f"--serviceaccount={namespace}:{SA}")  # fmt: skip
    try:
        yield
    finally:
        kubectl("delete", "clusterrolebinding", binding, check=False)


def test_a_rotated_token_is_reread_and_the_old_ones_expiry_causes_no_401(
    cluster: devcluster.ClusterState,
    crds: None,
    kubectl: Kubectl,
    namespace: str,
    emulator: HfEmulator,
    tmp_path: Path,
    admin_sa: None,
) -> None:
    token_file = tmp_path / "sa.token"
    first = _token(kubectl, namespace, "token-a")
    token_file.write_text(first)
    admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    kubeconfig = tmp_path / "rotating.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "sa",
        "clusters": admin["clusters"],
        "contexts": [{"name": "sa", "context": {"cluster": admin["clusters"][0]["name"], "user": "sa"}}],
        "users": [{"name": "sa", "user": {"tokenFile": token_file.name}}],
    }))  # fmt: skip
    env = {"KUBECONFIG": str(kubeconfig), "POSTTRAIN_CREDENTIALS_REFRESH_SECONDS": "2"}
    with running_operator(cluster, emulator, tmp_path, namespace, **env) as op:
        op.wait_ready()
        apply(kubectl, namespace, episode_manifest("before"))
        wait_phase(kubectl, namespace, "episode", "before", {"Running"})

        staged = tmp_path / "staged.token"
        staged.write_text(_token(kubectl, namespace, "token-b"))
        staged.replace(token_file)  # as the kubelet swaps a projected token
        kubectl("-n", namespace, "delete", "secret", "token-a")
        wait_for(lambda: _rejected(cluster, kubectl, first), what="the first token to be refused")
        rotated_at = len(op.current_log())

        apply(kubectl, namespace, episode_manifest("after"))
        wait_phase(kubectl, namespace, "episode", "after", {"Running"})
        apply(kubectl, namespace, agentjob_manifest("job1", "after"))
        job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded"}, timeout=90)
        assert job["status"]["settledMicroUSD"] > 0
        # Statuses, the ledger and Events were all written with the new token.
        events = json.loads(kubectl("-n", namespace, "get", "events", "-o", "json").stdout)["items"]
        assert any(e["involvedObject"]["name"] == "job1" and e["reason"] == "Submitted" for e in events)
        after = op.current_log()[rotated_at:]
        assert "401" not in after and "Unauthorized" not in after, after[-3000:]
