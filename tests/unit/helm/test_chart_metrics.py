"""The chart's observability: a metrics Service per component wired to the right port, a ServiceMonitor
only where the Prometheus Operator's API exists, the Grafana dashboard, and the operator's
NetworkPolicy opening its metrics port (and nothing more)."""

from __future__ import annotations

import json
from typing import Any

from posttrain_operator.config import OperatorSettings

from tests.unit.helm.chart import FULL, container_env, find, main_container, one, render

MONITORING = ("monitoring.coreos.com/v1",)


def _port_of(container: dict[str, Any], name: str) -> int:
    port: int = next(p["containerPort"] for p in container["ports"] if p["name"] == name)
    return port


def test_each_component_has_a_metrics_service_on_its_metrics_port() -> None:
    docs = render()
    operator = main_container(docs, f"{FULL}-operator")
    env = container_env(operator)
    assert int(env["POSTTRAIN_METRICS_PORT"]["value"]) == _port_of(operator, "metrics") == 8082
    assert OperatorSettings(metrics_port=int(env["POSTTRAIN_METRICS_PORT"]["value"])).metrics_port == 8082
    for component, target in (("operator", "metrics"), ("gateway", "http")):
        service = one(docs, "Service", f"{FULL}-{component}-metrics")
        assert service["spec"]["selector"]["app.kubernetes.io/component"] == component
        (port,) = service["spec"]["ports"]
        assert port["name"] == "metrics" and port["targetPort"] == target
    assert find(docs, "ServiceMonitor") == []  # no monitoring.coreos.com/v1 on a bare cluster


def test_service_monitors_render_only_where_the_api_exists() -> None:
    monitor = {"enabled": True, "interval": "15s", "labels": {"release": "kps"}}
    docs = render({"metrics": {"serviceMonitor": monitor}}, api_versions=MONITORING)
    monitors = find(docs, "ServiceMonitor")
    assert sorted(m["metadata"]["name"] for m in monitors) == [
        f"{FULL}-gateway-metrics",
        f"{FULL}-operator-metrics",
    ]
    services = {s["metadata"]["name"]: s for s in find(docs, "Service")}
    for monitor in monitors:
        assert monitor["metadata"]["labels"]["release"] == "kps"
        assert monitor["spec"]["endpoints"] == [{"port": "metrics", "path": "/metrics", "interval": "15s"}]
        wanted = monitor["spec"]["selector"]["matchLabels"]
        matched = [n for n, s in services.items() if wanted.items() <= s["metadata"]["labels"].items()]
        assert matched == [monitor["metadata"]["name"]]  # its own Service, not the broker's or the gateway's
    off = render(
        {"metrics": {"serviceMonitor": {"enabled": False, "interval": "30s"}}}, api_versions=MONITORING
    )
    assert find(off, "ServiceMonitor") == []


def _probe_rule(rule: dict[str, Any]) -> bool:
    """The `helm test` probe's rule (tests/unit/helm/test_chart_helm_test.py)."""
    selectors = [peer.get("podSelector", {}).get("matchLabels", {}) for peer in rule.get("from", [])]
    return any(s.get("app.kubernetes.io/component") == "test-probe" for s in selectors)


def test_metrics_off_renders_no_service_monitor_or_metrics_port_rule() -> None:
    off = {
        "enabled": False,
        "serviceMonitor": {"enabled": True, "interval": "30s"},
        "dashboard": {"enabled": False},
    }
    docs = render({"metrics": off}, api_versions=MONITORING)
    assert find(docs, "ServiceMonitor") == [] and find(docs, "ConfigMap", f"{FULL}-dashboard") == []
    assert not [s for s in find(docs, "Service") if s["metadata"]["name"].endswith("-metrics")]
    policy = one(docs, "NetworkPolicy", f"{FULL}-operator")
    # The broker's port only: for the gateway, and for the `helm test` probe.
    assert [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]] == [8081, 8081]


def test_operator_network_policy_opens_the_metrics_port_to_scrape_from_only() -> None:
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = render({"metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "interval": "30s"},
                               "dashboard": {"enabled": True}, "scrapeFrom": [scraper]}})  # fmt: skip
    rules = one(docs, "NetworkPolicy", f"{FULL}-operator")["spec"]["ingress"]
    by_port = {rule["ports"][0]["port"]: rule for rule in rules if not _probe_rule(rule)}
    assert set(by_port) == {8081, 8082}
    assert by_port[8082]["from"] == [scraper]
    assert by_port[8081]["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "gateway"


def test_dashboard_configmap_holds_panels_over_the_exposed_metrics() -> None:
    docs = render()
    configmap = one(docs, "ConfigMap", f"{FULL}-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["posttrain.json"])
    exprs = " ".join(t["expr"] for p in dashboard["panels"] for t in p["targets"])
    titles = " ".join(p["title"] for p in dashboard["panels"]).lower()
    for wanted in (
        "spend against budget",
        "agentjobs by phase",
        "rejections",
        "reward distribution",
        "backend errors",
        "spend by team",
        "quota used by team",
        "reward by task",
    ):
        assert wanted in titles, wanted
    for metric in (
        "posttrain_episode_budget_microdollars", "posttrain_episode_settled_microdollars",
        "posttrain_agentjobs", "posttrain_agentjob_rejections_total", "posttrain_gateway_refusals_total",
        "posttrain_episode_reward_bucket", "posttrain_backend_requests_total",
        "posttrain_admission_latency_seconds_bucket", "posttrain_quota_limit_microdollars",
    ):  # fmt: skip
        assert metric in exprs, metric
    # Per-team and per-task panels group by the labels the operator exposes.
    for grouping in ("sum by (namespace, backend, payer)", "sum by (task)", "sum by (namespace)"):
        assert grouping in exprs, grouping


def test_a_fenced_gateway_still_lets_scrapers_reach_its_metrics() -> None:
    orchestrators = {"podSelector": {"matchLabels": {"app": "trainer"}}}
    scraper = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}
    docs = render({"networkPolicy": {"enabled": True, "gatewayIngressFrom": [orchestrators]},
                   "metrics": {"enabled": True, "serviceMonitor": {"enabled": True, "interval": "30s"},
                               "dashboard": {"enabled": True}, "scrapeFrom": [scraper]}})  # fmt: skip
    rules = one(docs, "NetworkPolicy", f"{FULL}-gateway")["spec"]["ingress"]
    assert [r["from"] for r in rules if not _probe_rule(r)] == [[orchestrators], [scraper]]
    assert {p["port"] for r in rules for p in r["ports"]} == {8080}
