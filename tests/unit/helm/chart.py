"""Render the chart with helm (the devstack's helm v4 binary) and look at what it renders."""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from devstack.toolchain.paths import bin_dir

REPO = Path(__file__).resolve().parents[3]
CHART = REPO / "helm" / "posttrain-operator"
KUBE_VERSION = "1.34.4"
RELEASE = "pt"
NAMESPACE = "posttrain-system"
FULL = f"{RELEASE}-posttrain-operator"
OPERATOR_SA = f"system:serviceaccount:{NAMESPACE}:{FULL}-operator"
GATEWAY_SA = f"system:serviceaccount:{NAMESPACE}:{FULL}-gateway"
# Values that turn every optional part on (a platform team's HF Jobs install).
HF_VALUES: dict[str, Any] = {
    "hfJobs": {
        "enabled": True,
        "tokenSecret": {"name": "hf-token", "key": "token"},
        "namespace": "acme",
        "image": "registry.example/posttrain-launcher:0.1.0",
    },
}

# The pods backend with its artifact store (an NFS export every episode namespace can mount).
PODS: dict[str, Any] = {"enabled": True, "storeVolume": {"nfs": {"server": "nfs.example", "path": "/store"}}}


def helm() -> Path:
    path = bin_dir() / "helm"
    if not path.exists():
        pytest.skip(f"no helm binary at {path}: run `make binaries`")
    return path


def run_helm(*args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump(values or {}, f)
        f.flush()
        return subprocess.run(
            [str(helm()), *args, "--values", f.name],
            capture_output=True,
            text=True,
            timeout=60,
            cwd=REPO,
        )


def render_text(
    values: dict[str, Any] | None = None, release: str = RELEASE, api_versions: tuple[str, ...] = ()
) -> str:
    """`api_versions`: APIs the target cluster is to be taken to serve (`--api-versions`)."""
    extra = [arg for version in api_versions for arg in ("--api-versions", version)]
    proc = run_helm(
        "template", release, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION, *extra,
        values=values,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def render(
    values: dict[str, Any] | None = None, release: str = RELEASE, api_versions: tuple[str, ...] = ()
) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(render_text(values, release, api_versions)) if d]


def render_error(values: dict[str, Any]) -> str:
    proc = run_helm(
        "template", RELEASE, str(CHART), "--namespace", NAMESPACE, "--kube-version", KUBE_VERSION,
        values=values,
    )  # fmt: skip
    assert proc.returncode != 0, f"helm rendered values it should refuse: {json.dumps(values)}"
    return proc.stderr


def find(docs: list[dict[str, Any]], kind: str, name: str | None = None) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    found = find(docs, kind, name)
    assert len(found) == 1, f"{kind}/{name}: {len(found)} rendered"
    return found[0]


def pod_specs(docs: list[dict[str, Any]]) -> Iterator[tuple[str, dict[str, Any]]]:
    for d in docs:
        if d["kind"] == "Deployment":
            yield d["metadata"]["name"], d["spec"]["template"]["spec"]
        elif d["kind"] == "Pod":
            yield d["metadata"]["name"], d["spec"]


def container_env(container: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in container.get("env", [])}


Rule = tuple[str, str, str, str]  # (scope: "cluster" or a namespace, apiGroup, resource, verb)


def granted(docs: list[dict[str, Any]], username: str) -> set[Rule]:
    """Every (scope, group, resource, verb) the rendered RBAC grants to a ServiceAccount username."""
    _, sa_ns, sa_name = username.rsplit(":", 2)
    roles = {(d["kind"], d["metadata"].get("namespace"), d["metadata"]["name"]): d for d in docs
             if d["kind"] in ("Role", "ClusterRole")}  # fmt: skip
    rules: set[Rule] = set()
    for binding in docs:
        if binding["kind"] not in ("RoleBinding", "ClusterRoleBinding"):
            continue
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa_name and s["namespace"] == sa_ns
                   for s in binding["subjects"]):  # fmt: skip
            continue
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace") if binding["kind"] == "RoleBinding" else None
        role = roles[(ref["kind"], namespace if ref["kind"] == "Role" else None, ref["name"])]
        scope = namespace or "cluster"
        for rule in role["rules"]:
            assert "resourceNames" not in rule or rule["resourceNames"], rule
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"wildcard in {role['metadata']['name']}"
                        rules.add((scope, group, resource, verb))
    return rules


def main_container(docs: list[dict[str, Any]], deployment: str) -> dict[str, Any]:
    container: dict[str, Any] = one(docs, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][
        0
    ]
    return container
