"""The chart's RBAC, rule by rule: exactly what each identity needs, nothing more. The integration
test (tests/integration/helm) shows the same rules are enough for a whole episode."""

from __future__ import annotations

from typing import Any

import pytest

from tests.unit.helm.chart import GATEWAY_SA, NAMESPACE, OPERATOR_SA, PODS, Rule, granted, render

PODS_VALUES = {"pods": PODS, "gateway": {"defaultBackend": "pods"}}


def _rules(scope: str, group: str, resource: str, *verbs: str) -> set[Rule]:
    return {(scope, group, resource, verb) for verb in verbs}


FRAMEWORK = (
    _rules("cluster", "apiextensions.k8s.io", "customresourcedefinitions", "list", "watch")
    | _rules("cluster", "authentication.k8s.io", "tokenreviews", "create")
    # The leader's Lease, in the release namespace only.
    | _rules(NAMESPACE, "coordination.k8s.io", "leases", "get", "create", "update")
    | _rules("cluster", "authorization.k8s.io", "subjectaccessreviews", "create")
    # The registered tasks, written into the chart's task admission policy (that one only, by name).
    | _rules("cluster", "admissionregistration.k8s.io", "validatingadmissionpolicies", "get", "patch")
)


def application(scope: str) -> set[Rule]:
    return (
        _rules(scope, "posttrain.dev", "episodes", "get", "list", "watch", "patch")
        | _rules(scope, "posttrain.dev", "agentjobs", "get", "list", "watch", "patch", "create")
        | _rules(scope, "posttrain.dev", "episodes/status", "update")
        | _rules(scope, "posttrain.dev", "agentjobs/status", "patch")
        | _rules(scope, "posttrain.dev", "judgefindings", "get", "list", "watch", "patch")
        | _rules(scope, "posttrain.dev", "judgefindings/status", "patch")
        | _rules(scope, "posttrain.dev", "provenancerecords", "list", "create")
        # Quotas are read and their figures written; their terms are the platform's.
        | _rules(scope, "posttrain.dev", "budgetquotas", "get", "list")
        | _rules(scope, "posttrain.dev", "budgetquotas/status", "update")
        | _rules(scope, "posttrain.dev", "episodes/finalizers", "update")
        | _rules(scope, "posttrain.dev", "agentjobs/finalizers", "update")
        | _rules(scope, "", "events", "create")
        | _rules(scope, "", "secrets", "create", "get")
    )


PODS_BACKEND = (
    _rules("cluster", "", "namespaces", "get", "create", "delete")
    | _rules("cluster", "networking.k8s.io", "networkpolicies", "create", "list")
    | _rules("cluster", "", "pods", "get", "list", "create", "delete", "patch")
    | _rules("cluster", "", "pods/log", "get")
    | _rules("cluster", "", "events", "list")  # a sandbox that cannot be made says so only there
)


def gateway_rules(scope: str) -> set[Rule]:
    return (
        _rules(scope, "posttrain.dev", "episodes", "get", "list", "watch", "create", "patch", "delete")
        | _rules(scope, "posttrain.dev", "episodes/status", "patch")
        | _rules(scope, "posttrain.dev", "agentjobs", "get", "list", "watch", "create", "delete")
        | _rules(scope, "posttrain.dev", "provenancerecords", "list", "create")
    )


def test_operator_watching_all_namespaces_gets_exactly_its_rules(default_docs: list[dict[str, Any]]) -> None:
    assert granted(default_docs, OPERATOR_SA) == FRAMEWORK | application("cluster")


def test_operator_may_change_only_the_task_policy(default_docs: list[dict[str, Any]]) -> None:
    policies = [d for d in default_docs if d["kind"] == "ValidatingAdmissionPolicy"]
    task_policy = next(p["metadata"]["name"] for p in policies if p["spec"].get("variables"))
    rules = [
        rule
        for d in default_docs
        if d["kind"] == "ClusterRole"
        for rule in d["rules"]
        if "validatingadmissionpolicies" in rule["resources"]
    ]
    assert rules == [
        {
            "apiGroups": ["admissionregistration.k8s.io"],
            "resources": ["validatingadmissionpolicies"],
            "resourceNames": [task_policy],
            "verbs": ["get", "patch"],
        }
    ]
    without = render({"admissionPolicy": {"enabled": False}})
    assert not [d for d in without if d["kind"] == "ValidatingAdmissionPolicy"]
    assert "validatingadmissionpolicies" not in {r[2] for r in granted(without, OPERATOR_SA)}


def test_operator_watching_listed_namespaces_gets_roles_there_only() -> None:
    docs = render(
        {"operator": {"watchNamespaces": ["team-a", "team-b"]}, "gateway": {"episodeNamespace": "team-a"}}
    )
    namespace_discovery = _rules("cluster", "", "namespaces", "list", "watch")
    assert granted(docs, OPERATOR_SA) == (
        FRAMEWORK | namespace_discovery | application("team-a") | application("team-b")
    )


def test_pods_backend_rules_exist_only_when_pods_are_enabled(default_docs: list[dict[str, Any]]) -> None:
    resources = {r[2] for r in granted(default_docs, OPERATOR_SA)}
    assert not resources & {"pods", "pods/log", "networkpolicies", "namespaces"}
    assert ("cluster", "", "events", "list") not in granted(default_docs, OPERATOR_SA)
    enabled = render(PODS_VALUES)
    assert granted(enabled, OPERATOR_SA) == FRAMEWORK | application("cluster") | PODS_BACKEND


def test_gateway_gets_its_namespace_only_and_no_secrets(default_docs: list[dict[str, Any]]) -> None:
    assert granted(default_docs, GATEWAY_SA) == gateway_rules(NAMESPACE)
    elsewhere = render({"gateway": {"episodeNamespace": "episodes"}})
    assert granted(elsewhere, GATEWAY_SA) == gateway_rules("episodes")


@pytest.mark.parametrize(
    "values",
    [{}, PODS_VALUES, {"operator": {"watchNamespaces": [NAMESPACE]}}],
    ids=["defaults", "pods-enabled", "watched-namespaces"],
)
def test_no_identity_may_read_secrets_broadly_or_escalate(values: dict[str, Any]) -> None:
    docs = render(values)
    for user in (OPERATOR_SA, GATEWAY_SA):
        rules = granted(docs, user)
        assert not {
            r for r in rules if r[2] == "secrets" and r[3] in {"list", "watch", "update", "patch", "delete"}
        }
        assert not {r for r in rules if r[3] in {"escalate", "bind", "impersonate"}}
        assert not {r for r in rules if r[1] == "rbac.authorization.k8s.io"}
    assert not {r for r in granted(docs, GATEWAY_SA) if r[2] in {"secrets", "agentjobs/status", "pods"}}


JUDGE_SA = f"system:serviceaccount:{NAMESPACE}:llm-judge"


def test_only_the_judges_may_append_findings(default_docs: list[dict[str, Any]]) -> None:
    # No one is a judge by default; the gateway (which may patch Episodes) never is.
    assert granted(default_docs, JUDGE_SA) == set()
    for docs in (default_docs, render(PODS_VALUES)):
        assert not {r for r in granted(docs, GATEWAY_SA) if r[2].startswith("judgefindings")}
        assert not {r for r in granted(docs, OPERATOR_SA) if r[2] == "judgefindings" and r[3] == "create"}
    judged = render(
        {"judges": {"subjects": [{"kind": "ServiceAccount", "name": "llm-judge", "namespace": NAMESPACE}]}}
    )
    assert granted(judged, JUDGE_SA) == (
        _rules("cluster", "posttrain.dev", "judgefindings", "get", "list", "watch", "create")
        | _rules("cluster", "posttrain.dev", "episodes", "get", "list", "watch")
        | _rules("cluster", "posttrain.dev", "agentjobs", "get", "list", "watch")
        | _rules("cluster", "posttrain.dev", "provenancerecords", "get", "list", "watch")
    )


def test_disabled_gateway_has_no_identity_and_the_broker_trusts_nobody() -> None:
    docs = render({"gateway": {"enabled": False}})
    assert granted(docs, GATEWAY_SA) == set()
    operator = next(d for d in docs if d["kind"] == "Deployment")
    env = {e["name"]: e.get("value") for e in operator["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["POSTTRAIN_BROKER_ALLOWED_USERS"] == "[]"


def test_researchers_read_quotas_and_only_a_role_bound_by_the_platform_writes_them(
    default_docs: list[dict[str, Any]],
) -> None:
    quota_roles = ("-quota-viewer", "-quota-admin")
    roles = {d["metadata"]["name"].rsplit("-", 1)[1]: d for d in default_docs
             if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith(quota_roles)}  # fmt: skip
    viewer, admin = roles["viewer"], roles["admin"]
    aggregated = {k for k, v in viewer["metadata"]["labels"].items() if k.startswith("rbac.") and v == "true"}
    assert aggregated == {f"rbac.authorization.k8s.io/aggregate-to-{r}" for r in ("view", "edit", "admin")}
    assert viewer["rules"] == [{"apiGroups": ["posttrain.dev"], "resources": ["budgetquotas"],
                                "verbs": ["get", "list", "watch"]}]  # fmt: skip
    # A namespace admin must not raise their own limit: the writing role is aggregated nowhere, and
    # nothing the chart binds grants it.
    assert not any(k.startswith("rbac.") for k in admin["metadata"]["labels"])
    assert {"create", "update", "patch", "delete"} <= set(admin["rules"][0]["verbs"])
    bound = {d["roleRef"]["name"] for d in default_docs if d["kind"].endswith("Binding") and "roleRef" in d}
    assert admin["metadata"]["name"] not in bound and viewer["metadata"]["name"] not in bound
