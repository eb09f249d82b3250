"""`helm test`: besides the server-side dry run of an Episode, a probe pod (the chart's own image, no
ServiceAccount token) calls the gateway's /health, the operator's readiness and one orchestrator
exchange on the gateway; the NetworkPolicies let that pod, and no other test pod, in."""

from __future__ import annotations

from typing import Any

from tests.unit.helm.chart import CHART, FULL, HF_VALUES, NAMESPACE, container_env, find, one, render

PROBE = f"{FULL}-test-probe"
GATEWAY_SVC = f"{FULL}-gateway.{NAMESPACE}.svc"


def _probe_pod(values: dict[str, Any]) -> dict[str, Any]:
    return one(render(values), "Pod", PROBE)


def test_the_probe_pod_runs_the_shipped_script_in_the_chart_s_image_without_a_token() -> None:
    docs = render({**HF_VALUES, "image": {"repository": "registry.example/pt", "tag": "1.2.3"}})
    pod = one(docs, "Pod", PROBE)
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert pod["spec"]["automountServiceAccountToken"] is False and "serviceAccountName" not in pod["spec"]
    (container,) = pod["spec"]["containers"]
    assert container["image"] == "registry.example/pt:1.2.3"
    assert container["command"] == ["python", "/probe/probe.py"]
    env = container_env(container)
    assert env["GATEWAY_URL"]["value"] == f"http://{GATEWAY_SVC}:80"
    assert env["GATEWAY_HOST"]["value"] == GATEWAY_SVC
    assert env["OPERATOR_URL"]["value"] == f"http://{FULL}-broker.{NAMESPACE}.svc:8081"
    assert env["ORCHESTRATOR_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": f"{FULL}-orchestrator-token",
                                                                       "key": "token"}  # fmt: skip
    script = one(docs, "ConfigMap", PROBE)["data"]["probe.py"]
    assert script == (CHART / "files" / "helm-test-probe.py").read_text()
    # The image's users may not write its root filesystem: the script reads only its mount.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True


def test_the_probe_sends_a_host_the_gateway_accepts() -> None:
    pod = _probe_pod({**HF_VALUES, "gateway": {"allowedHosts": ["gw.internal:*", "other"]}})
    assert container_env(pod["spec"]["containers"][0])["GATEWAY_HOST"]["value"] == "gw.internal"


def test_no_gateway_no_probe() -> None:
    docs = render({**HF_VALUES, "gateway": {"enabled": False}})
    assert not find(docs, "Pod") and not find(docs, "ConfigMap", PROBE)


def _admits(policy: dict[str, Any], labels: dict[str, str], port: int) -> bool:
    for rule in policy["spec"].get("ingress", []):
        if port not in [p["port"] for p in rule.get("ports", [])]:
            continue
        sources = rule.get("from")
        # A pod of the release's namespace: a source naming other namespaces does not select it.
        if sources is None or any(
            "podSelector" in s
            and "namespaceSelector" not in s
            and set(s["podSelector"].get("matchLabels", {}).items()) <= set(labels.items())
            for s in sources
        ):
            return True
    return False


def test_the_network_policies_admit_the_probe_and_not_the_other_test_pod() -> None:
    agents = [{"podSelector": {"matchLabels": {"team": "agents"}}}]
    scrapers = [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]
    docs = render(
        {**HF_VALUES, "networkPolicy": {"gatewayIngressFrom": agents}, "metrics": {"scrapeFrom": scrapers}}
    )
    probe = one(docs, "Pod", PROBE)["metadata"]["labels"]
    dry_run = one(docs, "Pod", f"{FULL}-test")["metadata"]["labels"]  # holds the gateway's token
    operator = one(docs, "NetworkPolicy", f"{FULL}-operator")
    gateway = one(docs, "NetworkPolicy", f"{FULL}-gateway")
    assert _admits(operator, probe, 8081) and not _admits(operator, dry_run, 8081)
    assert _admits(gateway, probe, 8080) and not _admits(gateway, dry_run, 8080)
    # The gateway's own pods still reach the broker; the probe reaches nothing else on the operator.
    gateway_pod = one(docs, "Deployment", f"{FULL}-gateway")["spec"]["template"]["metadata"]["labels"]
    assert _admits(operator, gateway_pod, 8081) and not _admits(operator, probe, 8080)
