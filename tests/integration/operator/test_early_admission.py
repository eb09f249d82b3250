"""New jobs admitted from the operator's own watch, ahead of kopf, against the real API server: the
operator's first request about a new job is its claim of the finalizer (not a read), the job runs
once, and with early admission off kopf's handler admits alone. The API server's audit log says which
requests the operator made, in order."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config
from posttrain_operator.k8s import USER_AGENT, Kube

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

FINALIZER = "posttrain.dev/finalizer"


def operator_requests(cluster: devcluster.ClusterState, namespace: str, job: str) -> list[str]:
    """The operator's own requests about `job` (kopf's carry another user agent), in order."""
    found = []
    for path in sorted(cluster.audit_log.parent.glob("audit*.log")):
        for line in path.read_text().splitlines():
            if f'"{namespace}"' not in line or f'"{job}"' not in line:
                continue
            entry = json.loads(line)
            ref = entry.get("objectRef") or {}
            if (
                entry.get("stage") == "ResponseComplete"
                and ref.get("resource") == "agentjobs"
                and ref.get("name") == job
                and entry.get("userAgent", "").startswith(USER_AGENT)
            ):
                found.append(
                    (
                        entry["requestReceivedTimestamp"],
                        f"{entry['verb']} {ref.get('subresource', '')}".strip(),
                    )
                )
    return [request for _, request in sorted(found)]


def run_one_job(kubectl: Kubectl, namespace: str, emulator: HfEmulator) -> dict[str, Any]:
    apply(kubectl, namespace, episode_manifest("ep"))
    wait_phase(kubectl, namespace, "episode", "ep", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("j1", "ep"))
    return wait_phase(kubectl, namespace, "agentjob", "j1", {"Running"})


def test_a_new_job_is_claimed_from_the_operators_own_watch(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, namespace: str, emulator: HfEmulator,
    tmp_path: Path,
) -> None:  # fmt: skip
    with running_operator(cluster, emulator, tmp_path, namespace):
        job = run_one_job(kubectl, namespace, emulator)
        assert FINALIZER in job["metadata"]["finalizers"]
        requests = wait_for(lambda: operator_requests(cluster, namespace, "j1") or None, timeout=30,
                            what="the operator's requests in the audit log")  # fmt: skip
        assert requests[0] == "patch", requests  # the claim, sent with the Episode read and the ledger
        assert len(emulator.job_ids()) == 1


def test_with_early_admission_off_kopf_admits_alone(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, namespace: str, emulator: HfEmulator,
    tmp_path: Path,
) -> None:  # fmt: skip
    with running_operator(cluster, emulator, tmp_path, namespace, POSTTRAIN_EARLY_ADMISSION_PASSES="0"):
        job = run_one_job(kubectl, namespace, emulator)
        assert FINALIZER in job["metadata"]["finalizers"]
        requests = wait_for(lambda: operator_requests(cluster, namespace, "j1") or None, timeout=30,
                            what="the operator's requests in the audit log")  # fmt: skip
        assert requests[0] == "get", requests  # kopf's handler reads the job first
        assert len(emulator.job_ids()) == 1


async def _created(cluster: devcluster.ClusterState, kubectl: Kubectl, namespace: str) -> list[str]:
    cfg = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=cfg)
    kube = Kube.connect(client.ApiClient(configuration=cfg))
    seen: list[str] = []
    try:
        stream = kube.created_agentjobs(namespace)
        first = asyncio.ensure_future(anext(stream))
        await asyncio.sleep(1)  # listing, then watching from that version
        await asyncio.to_thread(apply, kubectl, namespace, agentjob_manifest("new", "ep"))
        seen.append((await asyncio.wait_for(first, 30))["metadata"]["name"])
        await stream.aclose()
    finally:
        await kube.close()
    return seen


def test_the_watch_announces_only_jobs_created_after_it_began(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, namespace: str
) -> None:
    apply(kubectl, namespace, agentjob_manifest("old", "ep"))
    assert asyncio.run(_created(cluster, kubectl, namespace)) == ["new"]
