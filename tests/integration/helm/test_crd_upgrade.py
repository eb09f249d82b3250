"""Upgrading a release whose CRDs changed, the documented way: `helm upgrade` leaves CRDs alone (by
Helm's design), so the changed CRDs are applied first with `kubectl apply --server-side`, then the
release is upgraded; objects made under the old CRDs survive."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl, kubectl_json
from tests.integration.helm.support import CHART, ChartOperator, Release, helm
from tests.integration.support import REPO, apply, episode_manifest, get

CRD = "episodes.posttrain.dev"
COLUMN = "Upgraded"


def _columns(kubectl: Kubectl) -> list[str]:
    crd = json.loads(kubectl("get", "crd", CRD, "-o", "json").stdout)
    return [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]


@pytest.fixture
def changed_chart(tmp_path: Path, kubectl: Kubectl) -> Iterator[Path]:
    """The chart, version bumped, with one more printer column on Episodes (a compatible change);
    the cluster's CRDs are put back afterwards for the tests that follow."""
    chart = tmp_path / "chart"
    shutil.copytree(CHART, chart)
    meta = yaml.safe_load((chart / "Chart.yaml").read_text())
    meta["version"] = "0.1.1"
    (chart / "Chart.yaml").write_text(yaml.safe_dump(meta))
    crd_file = chart / "crds" / "posttrain.dev_episodes.yaml"
    crd = yaml.safe_load(crd_file.read_text())
    column = {"name": COLUMN, "type": "string", "jsonPath": ".status.phase", "priority": 1}
    crd["spec"]["versions"][0]["additionalPrinterColumns"].append(column)
    crd_file.write_text(yaml.safe_dump(crd))
    try:
        yield chart
    finally:
        kubectl("apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds"))


def test_changed_crds_are_applied_before_helm_upgrade(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    release: Release,
    chart_operator: ChartOperator,  # registers the tasks, without which the policy refuses Episodes
    changed_chart: Path,
) -> None:
    ns = release.namespace
    apply(kubectl, ns, episode_manifest("before-upgrade"))
    assert COLUMN not in _columns(kubectl)

    values = ["--namespace", ns, "--reuse-values"]
    helm(cluster, "upgrade", release.name, str(changed_chart), *values)
    assert COLUMN not in _columns(kubectl), "helm upgrade never touches CRDs"

    # The documented step, then the upgrade.
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(changed_chart / "crds"))
    helm(cluster, "upgrade", release.name, str(changed_chart), *values)
    assert COLUMN in _columns(kubectl)
    (latest,) = json.loads(
        helm(cluster, "list", "-n", ns, "--filter", f"^{release.name}$", "-o", "json").stdout
    )
    assert (latest["status"], latest["chart"], latest["revision"]) == (
        "deployed",
        "posttrain-operator-0.1.1",
        "3",
    )
    assert get(kubectl, ns, "episode", "before-upgrade")["spec"]["task"] == "t0_artifact"
    wide = kubectl("-n", ns, "get", "episodes", "-o", "wide").stdout
    assert COLUMN.upper() in wide
    # The upgrades kept the operator's list of tasks in the task policy: Episodes are still admitted.
    policy = kubectl_json(kubectl, "get", "validatingadmissionpolicy", f"{release.fullname}-tasks")
    assert "'t0_artifact'" in policy["spec"]["variables"][0]["expression"]
    apply(kubectl, ns, episode_manifest("after-upgrade"))
