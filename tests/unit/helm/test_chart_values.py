"""The values schema refuses what the chart does not know, and the preflight refuses contradictions
with a message that says how to fix them."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml

from tests.unit.helm.chart import CHART, HF_VALUES, PODS, render, render_error, run_helm


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"replicaCount": 2}, "replicaCount"),
        ({"operator": {"extraArgs": ["--verbose"]}}, "extraArgs"),
        ({"hfJobs": {"token": "hf_abcdefghijklmnopqrstuvwxyz"}}, "token"),
        ({"hfJobs": {"tokenSecret": {"name": "hf", "key": "token", "value": "hf_abc"}}}, "value"),
        ({"gateway": {"orchestratorToken": "s3cret"}}, "orchestratorToken"),
        ({"image": {"pullPolicy": "Sometimes"}}, "pullPolicy"),
        ({"operator": {"watchNamespaces": ["Not_A_Namespace"]}}, "watchNamespaces"),
        ({"operator": {"resources": {"requests": {"gpu": 1}}}}, "gpu"),
        ({"networkPolicy": {"gatewayIngressFrom": [{"podSelektor": {}}]}}, "podSelektor"),
        ({"pods": {"storeVolume": {"persistentVolumeClaim": {"claimName": "x"}}}}, "persistentVolumeClaim"),
        ({"admissionPolicy": {"namespaceSelector": {"matchLabel": {"a": "b"}}}}, "matchLabel"),
        # In-tree cephfs volumes were removed in Kubernetes 1.31, the chart's minimum.
        ({"pods": {"storeVolume": {"cephfs": {"monitors": ["10.0.0.1:6789"]}}}}, "cephfs"),
        # Task settings are the plugins' own variables: never the operator's, nor where the assets are.
        ({"tasks": {"settings": {"POSTTRAIN_HF_TOKEN": "hf_x"}}}, "POSTTRAIN_HF_TOKEN"),
        ({"tasks": {"settings": {"POSTTRAIN_TASK_ASSETS_NAMESPACE": "x"}}}, "TASK_ASSETS_NAMESPACE"),
        ({"tasks": {"settings": {"POSTTRAIN_TASK_POLICY_NAME": "x"}}}, "POSTTRAIN_TASK_POLICY_NAME"),
        ({"tasks": {"settings": {"POSTTRAIN_TASK_GSM8K_BASE": {"a": 1}}}}, "POSTTRAIN_TASK_GSM8K_BASE"),
        # A number would render as helm formats floats (1.0368e+06): quote it.
        ({"tasks": {"settings": {"POSTTRAIN_TASK_GSM8K_MAX_WALL_SECONDS": 1036800}}}, "MAX_WALL_SECONDS"),
    ],
    ids=[
        "unknown-top-level", "unknown-nested", "token-value-in-values", "secret-value-beside-ref",
        "orchestrator-token-value", "bad-pull-policy", "bad-namespace", "unknown-resource",
        "typo-in-network-peer", "store-cannot-be-a-pvc", "typo-in-label-selector", "no-cephfs-store",
        "task-setting-not-a-task-variable", "task-setting-moving-the-assets", "task-setting-the-policy",
        "task-setting-not-a-scalar", "task-setting-a-number",
    ],
)  # fmt: skip
def test_schema_refuses(values: dict[str, Any], complaint: str) -> None:
    error = render_error(values)
    assert "values don't meet the specifications of the schema" in error, error
    assert complaint in error, error


def test_schema_accepts_a_full_platform_install() -> None:
    selector = {"matchExpressions": [{"key": "x", "operator": "Exists"}]}
    values = {
        **HF_VALUES,
        "image": {"repository": "registry.example.com/posttrain", "tag": "0.1.0", "pullPolicy": "Never"},
        "imagePullSecrets": [{"name": "regcred"}],
        "operator": {"watchNamespaces": ["posttrain-system"], "tolerations": [{"key": "k"}]},
        "networkPolicy": {"enabled": True, "gatewayIngressFrom": [{"namespaceSelector": selector}]},
        "admissionPolicy": {"enabled": True, "namespaceSelector": selector},
    }  # fmt: skip
    assert render(values)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"hfJobs": {"enabled": True, "namespace": "acme"}},
            "hfJobs.enabled is true but hfJobs.tokenSecret.name is empty: create a Secret holding the HF",
        ),
        (
            {"hfJobs": {"enabled": True, "tokenSecret": {"name": "hf-token", "key": "token"}}},
            "hfJobs.enabled is true but hfJobs.namespace is empty",
        ),
        (
            {"operator": {"watchNamespaces": ["elsewhere"]}},
            'the gateway creates Episodes in namespace "posttrain-system", which operator.watchNamespaces',
        ),
        ({"gateway": {"defaultBackend": "pods"}}, "gateway.defaultBackend is pods but pods.enabled is false"),
        ({"pods": {"enabled": True}}, "pods.enabled is true but pods.storeVolume is empty"),
    ],
    ids=[
        "hf-without-secret",
        "hf-without-namespace",
        "gateway-namespace-unwatched",
        "pods-default-disabled",
        "pods-without-store",
    ],
)
def test_preflight_refuses_contradictions(values: dict[str, Any], message: str) -> None:
    assert message in render_error(values)


def test_kubernetes_before_1_31_is_refused() -> None:
    """AgentJobs are listed by field selector (selectableFields), on by default from 1.31."""
    proc = run_helm("template", "r", str(CHART), "--kube-version", "1.30.9")
    assert proc.returncode != 0
    assert "kubeVersion" in proc.stderr and ">=1.31" in proc.stderr, proc.stderr
    assert run_helm("template", "r", str(CHART), "--kube-version", "1.31.0").returncode == 0


@pytest.mark.parametrize(
    "values", [HF_VALUES, {"pods": PODS, "gateway": {"defaultBackend": "pods"}}],
    ids=["hf-jobs", "pods"],
)  # fmt: skip
def test_notes_name_example_files_that_exist(values: dict[str, Any]) -> None:
    proc = run_helm("install", "r", str(CHART), "--dry-run=client", values=values)
    assert proc.returncode == 0, proc.stderr
    notes = proc.stdout.split("NOTES:", 1)[1]
    named = re.findall(r"examples/[\w.-]+\.yaml", notes)
    assert named and all((CHART.parents[1] / path).is_file() for path in named), named
    for path in named:  # the episode the notes wait on is the one the file creates
        name = yaml.safe_load((CHART.parents[1] / path).read_text())["metadata"]["name"]
        assert f"episode/{name}" in notes
