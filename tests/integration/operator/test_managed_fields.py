"""The operator drops `metadata.managedFields` from what it reads (and kopf's watch events, see
`lean_watch`), so its compare-and-swap status writes go out without them: the API server must then keep
its record of field managers as it was, the other writers' entries included, and only add the
operator's own."""

from __future__ import annotations

import json

from posttrain_operator import client_environment
from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.k8s import USER_AGENT, Kube

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl, kubectl_json
from tests.integration.support import episode_manifest


def _managers(kubectl: Kubectl, namespace: str, name: str) -> dict[tuple[str, str], dict[str, object]]:
    body = kubectl_json(kubectl, "-n", namespace, "get", "episode", name, "--show-managed-fields")
    return {
        (e["manager"], e.get("subresource", "")): e["fieldsV1"] for e in body["metadata"]["managedFields"]
    }


async def test_a_status_write_without_managed_fields_keeps_the_servers_record(
    cluster: devcluster.ClusterState, kubectl: Kubectl, namespace: str, crds: None
) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(episode_manifest("ep")))
    before = _managers(kubectl, namespace, "ep")
    assert before, "the API server recorded no field manager for the create"
    kube = Kube.connect(
        await client_environment.make_api_client(str(cluster.kubeconfig), user_agent=USER_AGENT)
    )
    try:
        read = await kube.get_episode(namespace, "ep")
        assert read is not None and "managedFields" not in read["metadata"]

        def to_pending(body: dict[str, object], current: EpisodeStatus) -> tuple[EpisodeStatus, None]:
            return current.model_copy(update={"phase": "Pending", "dev_evaluations": 2}), None

        update = await kube.update_episode_status(namespace, "ep", to_pending, seen=read)
        assert update.written and "managedFields" not in update.body["metadata"]
    finally:
        await kube.close()
    after = _managers(kubectl, namespace, "ep")
    assert {key: after[key] for key in before} == before, "a writer's entry changed or went"
    new_writers = {manager for manager, _ in after} - {manager for manager, _ in before}
    written = [fields for (who, sub), fields in after.items() if sub == "status" and who in new_writers]
    assert any("f:devEvaluations" in json.dumps(fields) for fields in written), after
