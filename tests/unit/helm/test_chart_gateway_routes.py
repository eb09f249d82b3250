"""The gateway reached from outside the cluster: an optional Ingress or HTTPRoute to its Service, whose
hosts the gateway then accepts (its DNS-rebinding check refuses any Host it was not told)."""

from __future__ import annotations

import json
from typing import Any

from env_gateway.http_mcp import host_allowed
from tests.unit.helm.chart import (
    FULL,
    HF_VALUES,
    NAMESPACE,
    container_env,
    find,
    main_container,
    one,
    render,
    render_error,
)

GATEWAY = f"{FULL}-gateway"
INGRESS: dict[str, Any] = {
    "enabled": True,
    "className": "nginx",
    "annotations": {"cert-manager.io/cluster-issuer": "letsencrypt"},
    "hosts": ["posttrain.example.com"],
    "tls": [{"secretName": "posttrain-tls", "hosts": ["posttrain.example.com", "pt.example.com"]}],
}
ROUTE: dict[str, Any] = {
    "enabled": True,
    "parentRefs": [{"name": "public", "namespace": "gateway-system", "sectionName": "https"}],
    "hostnames": ["agents.example.org"],
}


def _with_gateway(**gateway: Any) -> dict[str, Any]:
    return {**HF_VALUES, "gateway": gateway}


def _allowed_hosts(docs: list[dict[str, Any]]) -> list[str]:
    hosts: list[str] = json.loads(
        container_env(main_container(docs, GATEWAY))["GATEWAY_ALLOWED_HOSTS"]["value"]
    )
    return hosts


def test_no_ingress_nor_route_by_default_and_only_in_cluster_hosts_are_accepted() -> None:
    docs = render(HF_VALUES)
    assert not find(docs, "Ingress") and not find(docs, "HTTPRoute")
    hosts = _allowed_hosts(docs)
    assert host_allowed(f"{GATEWAY}.{NAMESPACE}.svc:80", hosts)
    assert not host_allowed("posttrain.example.com", hosts)


def test_an_ingress_routes_its_hosts_to_the_gateway_service_which_accepts_them() -> None:
    docs = render(_with_gateway(ingress=INGRESS))
    ingress = one(docs, "Ingress", GATEWAY)
    assert ingress["metadata"]["namespace"] == NAMESPACE
    assert ingress["metadata"]["annotations"] == INGRESS["annotations"]
    assert ingress["spec"]["ingressClassName"] == "nginx" and ingress["spec"]["tls"] == INGRESS["tls"]
    (rule,) = ingress["spec"]["rules"]
    assert rule["host"] == "posttrain.example.com"
    (path,) = rule["http"]["paths"]
    assert (path["path"], path["pathType"]) == ("/", "Prefix")
    assert path["backend"]["service"] == {"name": GATEWAY, "port": {"name": "http"}}
    service = one(docs, "Service", GATEWAY)
    assert "http" in [p["name"] for p in service["spec"]["ports"]]
    hosts = _allowed_hosts(docs)
    for host in ("posttrain.example.com", "posttrain.example.com:443", "pt.example.com"):
        assert host_allowed(host, hosts), host
    assert host_allowed(f"{GATEWAY}.{NAMESPACE}.svc", hosts)  # the in-cluster names stay
    assert not host_allowed("evil.example.com", hosts)


def test_an_http_route_attaches_to_its_gateway_and_its_hostnames_are_accepted() -> None:
    docs = render(_with_gateway(httpRoute=ROUTE))
    route = one(docs, "HTTPRoute", GATEWAY)
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"]["parentRefs"] == ROUTE["parentRefs"]
    assert route["spec"]["hostnames"] == ["agents.example.org"]
    (rule,) = route["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/"}}]
    assert rule["backendRefs"] == [{"name": GATEWAY, "port": 80}]
    assert host_allowed("agents.example.org", _allowed_hosts(docs)) and not find(docs, "Ingress")


def test_explicit_allowed_hosts_still_get_the_routed_hosts() -> None:
    docs = render(_with_gateway(allowedHosts=["gw.internal"], ingress=INGRESS, httpRoute=ROUTE))
    hosts = _allowed_hosts(docs)
    assert host_allowed("gw.internal", hosts) and host_allowed("agents.example.org:8443", hosts)
    assert host_allowed("posttrain.example.com", hosts)
    assert not host_allowed(f"{GATEWAY}.{NAMESPACE}.svc", hosts)  # explicit hosts replace the defaults
    assert len(hosts) == len(set(hosts))


def test_routes_without_hosts_or_with_wildcards_are_refused_with_how_to_fix() -> None:
    assert "gateway.ingress.hosts is empty" in render_error(_with_gateway(ingress={"enabled": True}))
    error = render_error(_with_gateway(httpRoute={"enabled": True, "hostnames": ["a.example.org"]}))
    assert "parentRefs" in error
    # The gateway compares Host headers exactly: a wildcard would let nothing in, so it is refused.
    assert "hosts" in render_error(_with_gateway(ingress={**INGRESS, "hosts": ["*.example.com"]}))
    assert "hostnames" in render_error(_with_gateway(httpRoute={**ROUTE, "hostnames": ["*.example.org"]}))
    assert "pathType" in render_error(_with_gateway(ingress={**INGRESS, "pathType": "Regex"}))
