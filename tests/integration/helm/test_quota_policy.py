"""The chart's BudgetQuota rules on the devstack's API server: its episode-quota admission policy
refuses an Episode its namespace's quota does not allow, with the numbers, and lets everything through
where the namespace has none; RBAC lets researchers (the built-in edit role) read quotas and nobody
the chart binds write their terms, the operator included."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers import Kubectl, kubectl_json, wait_for
from tests.integration.helm.support import ChartOperator, Release
from tests.integration.helm.test_chart_rbac import can_i
from tests.integration.support import episode_manifest

QUOTA = {
    "apiVersion": "posttrain.dev/v1alpha1",
    "kind": "BudgetQuota",
    "metadata": {"name": "default"},
    "spec": {
        "limitUSD": "100",
        "maxEpisodeBudgetUSD": "5",
        "flavors": ["cpu-basic"],
        "backends": ["hf-jobs"],
    },
}


def _create(kubectl: Kubectl, namespace: str, manifest: dict[str, Any]) -> Any:
    return kubectl(
        "-n", namespace, "create", "--dry-run=server", "-o", "name", "-f", "-",
        check=False, input=json.dumps(manifest),
    )  # fmt: skip


def test_episodes_the_namespace_quota_does_not_allow_are_refused_at_creation(
    kubectl: Kubectl, release: Release, chart_operator: ChartOperator
) -> None:
    ns = release.namespace
    too_big = episode_manifest("too-big", budget="10.00")
    assert _create(kubectl, ns, too_big).returncode == 0  # no quota: as without the feature
    kubectl("-n", ns, "create", "-f", "-", input=json.dumps(QUOTA))

    # The policy reads its parameter through the API server's informer, a moment later.
    refused = wait_for(
        lambda: (r := _create(kubectl, ns, too_big)).returncode != 0 and r,
        timeout=30, what="the episode-quota policy to see the new quota",
    )  # fmt: skip
    assert (
        "budgetUSD 10.00 is above the 5 the namespace BudgetQuota allows one Episode (maxEpisodeBudgetUSD)"
        in refused.stderr
    ), refused.stderr
    outside = _create(kubectl, ns, episode_manifest("gpu", flavors=["cpu-basic", "a100-large", "t4-small"]))
    assert outside.returncode != 0
    assert (
        "flavors a100-large, t4-small are not among the flavors the namespace BudgetQuota allows: cpu-basic"
        in outside.stderr
    ), outside.stderr
    pods = _create(kubectl, ns, episode_manifest("in-pods", backend="pods"))
    assert pods.returncode != 0
    assert "backend pods is not among the backends the namespace BudgetQuota allows: hf-jobs" in pods.stderr
    # At the cap, within the flavors, or with no flavors listed (the operator narrows the task's).
    for fits in (
        episode_manifest("at-cap", budget="5"),
        episode_manifest("listed", flavors=["cpu-basic"]),
        episode_manifest("unlisted"),
    ):
        assert _create(kubectl, ns, fits).returncode == 0, fits
    assert kubectl_json(kubectl, "-n", ns, "get", "episodes")["items"] == []  # dry runs only


def test_researchers_read_the_quota_and_only_the_platform_writes_its_terms(
    kubectl: Kubectl, release: Release
) -> None:
    ns = release.namespace
    kubectl("-n", ns, "create", "serviceaccount", "researcher")
    kubectl("-n", ns, "create", "rolebinding", "researcher-edit", "--clusterrole=edit",
            f"--serviceaccount={ns}:researcher")  # fmt: skip
    kubectl("-n", ns, "create", "serviceaccount", "platform")
    admin = f"--clusterrole={release.fullname}-quota-admin"
    kubectl("-n", ns, "create", "rolebinding", "platform-quotas", admin, f"--serviceaccount={ns}:platform")
    researcher = f"system:serviceaccount:{ns}:researcher"
    platform = f"system:serviceaccount:{ns}:platform"
    quotas = "budgetquotas.posttrain.dev"
    # The edit role gains the quota viewer by aggregation (the controller manager), a moment later.
    wait_for(
        lambda: can_i(kubectl, researcher, "get", quotas, ns), timeout=60, what="quota-viewer aggregated"
    )
    assert can_i(kubectl, researcher, "list", quotas, ns) and can_i(kubectl, researcher, "watch", quotas, ns)
    for who in (researcher, release.operator_user, release.gateway_user):
        for verb in ("create", "update", "patch", "delete"):
            assert not can_i(kubectl, who, verb, quotas, ns), (who, verb)
    assert not can_i(kubectl, researcher, "update", f"{quotas}/status", ns)
    assert can_i(kubectl, release.operator_user, "update", f"{quotas}/status", ns)
    for verb in ("create", "update", "patch", "delete"):
        assert can_i(kubectl, platform, verb, quotas, ns), verb
