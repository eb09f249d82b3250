"""The devstack cluster is a real control plane: API machinery, RBAC, and controllers all work."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest
import yaml

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl, kubectl_json, make_kubectl, wait_for


def _widget_crd(group: str) -> dict[str, object]:
    """A CRD with a strict schema, a CEL immutability rule and a status subresource."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"widgets.{group}"},
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {
                                "spec": {
                                    "type": "object",
                                    "required": ["size"],
                                    "properties": {
                                        "size": {"type": "integer", "minimum": 1},
                                        "colour": {
                                            "type": "string",
                                            "x-kubernetes-validations": [
                                                {"rule": "self == oldSelf", "message": "colour is immutable"}
                                            ],
                                        },
                                    },
                                },
                                "status": {"type": "object", "properties": {"seen": {"type": "integer"}}},
                            },
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module")
def widget_group(kubectl: Kubectl) -> str:
    group = f"w{uuid.uuid4().hex[:8]}.devstack.test"
    kubectl("apply", "-f", "-", input=json.dumps(_widget_crd(group)))
    kubectl("wait", "--for=condition=Established", f"crd/widgets.{group}", "--timeout=30s")
    return group


def _widget(group: str, name: str, size: object, colour: str = "red") -> str:
    return json.dumps(
        {
            "apiVersion": f"{group}/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"size": size, "colour": colour},
        }
    )


def test_version_is_v1_34(cluster: devcluster.ClusterState) -> None:
    version = devcluster.api_get(cluster, "/version")
    assert version["gitVersion"].startswith("v1.34."), version
    assert version["minor"] == "34"


def test_schema_rejects_an_invalid_object(kubectl: Kubectl, namespace: str, widget_group: str) -> None:
    bad = kubectl("-n", namespace, "create", "-f", "-", input=_widget(widget_group, "w", 0), check=False)
    assert bad.returncode != 0
    assert "spec.size" in bad.stderr and "should be greater than or equal to 1" in bad.stderr
    wrong_type = kubectl(
        "-n", namespace, "create", "-f", "-", input=_widget(widget_group, "w", "big"), check=False
    )
    assert wrong_type.returncode != 0 and "spec.size" in wrong_type.stderr
    listed = kubectl_json(kubectl, "-n", namespace, "get", f"widgets.{widget_group}")
    assert listed["items"] == []


def test_cel_rule_rejects_a_change(kubectl: Kubectl, namespace: str, widget_group: str) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=_widget(widget_group, "w", 1))
    changed = kubectl(
        "-n", namespace, "patch", f"widgets.{widget_group}", "w", "--type=merge",
        "-p", '{"spec":{"colour":"blue"}}', check=False,
    )  # fmt: skip
    assert changed.returncode != 0 and "colour is immutable" in changed.stderr
    obj = kubectl_json(kubectl, "-n", namespace, "get", f"widgets.{widget_group}", "w")
    assert obj["spec"]["colour"] == "red"


def test_status_subresource_ignores_spec_changes(kubectl: Kubectl, namespace: str, widget_group: str) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=_widget(widget_group, "w", 1))
    kubectl(
        "-n", namespace, "patch", f"widgets.{widget_group}", "w", "--subresource=status", "--type=merge",
        "-p", '{"spec":{"size":99},"status":{"seen":7}}',
    )  # fmt: skip
    obj = kubectl_json(kubectl, "-n", namespace, "get", f"widgets.{widget_group}", "w")
    assert obj["status"] == {"seen": 7}
    assert obj["spec"]["size"] == 1


def test_rbac_denies_without_role_and_allows_with_one(
    cluster: devcluster.ClusterState, kubectl: Kubectl, namespace: str, tmp_path: Path
) -> None:
    kubectl("-n", namespace, "create", "serviceaccount", "reader")
    as_reader = make_kubectl(
        cluster, devcluster.mint_service_account_kubeconfig(cluster, namespace, "reader", tmp_path / "kc")
    )
    denied = as_reader("-n", namespace, "get", "configmaps", check=False)
    assert denied.returncode != 0 and "forbidden" in denied.stderr.lower()

    kubectl("-n", namespace, "create", "role", "cm-reader", "--verb=get,list", "--resource=configmaps")
    kubectl(
        "-n", namespace, "create", "rolebinding", "cm-reader", "--role=cm-reader",
        f"--serviceaccount={namespace}:reader",
    )  # fmt: skip
    allowed = wait_for(
        lambda: as_reader("-n", namespace, "get", "configmaps", check=False).returncode == 0,
        what="the RoleBinding to take effect",
    )
    assert allowed
    still_denied = as_reader("-n", namespace, "get", "secrets", check=False)
    assert still_denied.returncode != 0 and "forbidden" in still_denied.stderr.lower()


def test_deleting_an_owner_garbage_collects_its_dependent(kubectl: Kubectl, namespace: str) -> None:
    kubectl("-n", namespace, "create", "configmap", "owner")
    owner_uid = kubectl_json(kubectl, "-n", namespace, "get", "configmap", "owner")["metadata"]["uid"]
    dependent = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": "dependent",
            "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner_uid}],
        },
    }
    kubectl("-n", namespace, "create", "-f", "-", input=yaml.safe_dump(dependent))
    kubectl("-n", namespace, "delete", "configmap", "owner")
    wait_for(
        lambda: kubectl("-n", namespace, "get", "configmap", "dependent", check=False).returncode != 0,
        what="the garbage collector to delete the dependent",
    )


def test_deleting_a_namespace_completes(kubectl: Kubectl) -> None:
    name = f"gone-{uuid.uuid4().hex[:8]}"
    kubectl("create", "namespace", name)
    kubectl("-n", name, "create", "configmap", "content")
    kubectl("-n", name, "create", "serviceaccount", "someone")
    kubectl("delete", "namespace", name, "--wait=true", "--timeout=60s")
    assert kubectl("get", "namespace", name, check=False).returncode != 0
