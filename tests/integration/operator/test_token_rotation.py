"""Credentials that expire keep working: the operator runs with a ServiceAccount token read from a
kubeconfig `tokenFile`; the token is replaced by a new one and the old one revoked; the operator goes
on reconciling with no 401."""

from __future__ import annotations

import json
from pathlib import Path

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl
from tests.integration.rotating_token import cluster_admin_with_rotating_token
from tests.integration.support import (
    agentjob_manifest,
    apply,
    episode_manifest,
    running_operator,
    wait_phase,
)


def test_a_rotated_token_is_reread_and_the_old_ones_expiry_causes_no_401(
    cluster: devcluster.ClusterState,
    crds: None,
    kubectl: Kubectl,
    namespace: str,
    emulator: HfEmulator,
    tmp_path: Path,
) -> None:
    with cluster_admin_with_rotating_token(cluster, kubectl, namespace, "rotating-operator", tmp_path) as sa:
        env = {"KUBECONFIG": str(sa.kubeconfig), "POSTTRAIN_CREDENTIALS_REFRESH_SECONDS": "2"}
        with running_operator(cluster, emulator, tmp_path, namespace, **env) as op:
            op.wait_ready()
            apply(kubectl, namespace, episode_manifest("before"))
            wait_phase(kubectl, namespace, "episode", "before", {"Running"})

            sa.rotate()
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
