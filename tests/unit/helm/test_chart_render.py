"""What `helm template` renders: locked-down pods, Secrets only by reference, the wiring between the
operator and the gateway, NetworkPolicies, the admission policy, the test hook, names and CRDs."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from posttrain_operator.api import crds
from posttrain_operator.config import OperatorSettings

from env_gateway.config import GatewaySettings
from graders.job_limits import JobLimitMaxima
from graders.tasks import AssetLocation
from tests.unit.helm.chart import (
    CHART,
    FULL,
    GATEWAY_SA,
    HF_VALUES,
    NAMESPACE,
    OPERATOR_SA,
    PODS,
    REPO,
    container_env,
    find,
    main_container,
    one,
    pod_specs,
    render,
    render_error,
    render_text,
    run_helm,
)

SUFFIXES = (
    "-operator",
    "-test-probe",
    "-gateway",
    "-broker",
    "-operator-framework",
    "-operator-leader",
    "-uninstall",
    "-judge",
    "-operator-pods",
    "-test",
    "-score-jobs",
    "-provenance-writers",
    "-tasks",
    "-operator-metrics",
    "-gateway-metrics",
    "-dashboard",
    "-quota-viewer",
    "-quota-admin",
    "-episode-quota",
)
PODS_AND_HF = {**HF_VALUES, "pods": PODS}
LOCKED_CONTAINER = {
    "allowPrivilegeEscalation": False,
    "readOnlyRootFilesystem": True,
    "runAsNonRoot": True,
    "runAsUser": 10000,
    "runAsGroup": 10000,
    "capabilities": {"drop": ["ALL"]},
    "seccompProfile": {"type": "RuntimeDefault"},
}


def test_lint_strict_is_clean() -> None:
    for values in ({}, HF_VALUES, {**HF_VALUES, "pods": PODS}):
        proc = run_helm("lint", "--strict", "--kube-version", "1.34.4", str(CHART), values=values)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "[WARNING]" not in proc.stdout and "[ERROR]" not in proc.stdout, proc.stdout


def test_default_render_is_the_expected_set_of_objects(default_docs: list[dict[str, Any]]) -> None:
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in default_docs)
    assert kinds == sorted([
        ("ClusterRole", f"{FULL}-operator"),
        ("ClusterRole", f"{FULL}-operator-framework"),
        ("ClusterRole", f"{FULL}-judge"),
        ("ClusterRole", f"{FULL}-quota-viewer"),
        ("ClusterRole", f"{FULL}-quota-admin"),
        ("ClusterRoleBinding", f"{FULL}-operator"),
        ("ClusterRoleBinding", f"{FULL}-operator-framework"),
        ("ClusterRole", f"{FULL}-uninstall"),
        ("ClusterRoleBinding", f"{FULL}-uninstall"),
        ("Job", f"{FULL}-uninstall"),
        ("ServiceAccount", f"{FULL}-uninstall"),
        ("ConfigMap", f"{FULL}-dashboard"),
        ("ConfigMap", f"{FULL}-test"),
        ("ConfigMap", f"{FULL}-test-probe"),
        ("Deployment", f"{FULL}-gateway"),
        ("Deployment", f"{FULL}-operator"),
        ("NetworkPolicy", f"{FULL}-gateway"),
        ("NetworkPolicy", f"{FULL}-operator"),
        ("Pod", f"{FULL}-test"),
        ("Pod", f"{FULL}-test-probe"),
        ("Role", f"{FULL}-gateway"),
        ("Role", f"{FULL}-operator-leader"),
        ("RoleBinding", f"{FULL}-gateway"),
        ("RoleBinding", f"{FULL}-operator-leader"),
        ("Service", f"{FULL}-broker"),
        ("Service", f"{FULL}-gateway"),
        ("Service", f"{FULL}-gateway-metrics"),
        ("Service", f"{FULL}-operator-metrics"),
        ("ServiceAccount", f"{FULL}-gateway"),
        ("ServiceAccount", f"{FULL}-operator"),
        ("ValidatingAdmissionPolicy", f"{FULL}-provenance-writers"),
        ("ValidatingAdmissionPolicy", f"{FULL}-score-jobs"),
        ("ValidatingAdmissionPolicy", f"{FULL}-tasks"),
        ("ValidatingAdmissionPolicy", f"{FULL}-episode-quota"),
        ("ValidatingAdmissionPolicyBinding", f"{FULL}-episode-quota"),
        ("ValidatingAdmissionPolicyBinding", f"{FULL}-provenance-writers"),
        ("ValidatingAdmissionPolicyBinding", f"{FULL}-score-jobs"),
        ("ValidatingAdmissionPolicyBinding", f"{FULL}-tasks"),
    ])  # fmt: skip


@pytest.mark.parametrize("values", [{}, HF_VALUES], ids=["defaults", "hf-jobs"])
def test_every_pod_is_locked_down(values: dict[str, Any]) -> None:
    specs = dict(pod_specs(render(values)))
    assert set(specs) == {f"{FULL}-operator", f"{FULL}-gateway", f"{FULL}-test", f"{FULL}-test-probe"}
    for name, spec in specs.items():
        assert spec["securityContext"]["runAsNonRoot"] is True, name
        assert spec["securityContext"]["runAsUser"] == 10000, name
        assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}, name
        assert not spec.get("hostNetwork") and not spec.get("hostPID") and not spec.get("hostIPC"), name
        for container in spec["containers"]:
            assert container["securityContext"] == LOCKED_CONTAINER, name
            assert not any(
                m.get("mountPath", "").startswith("/var/run/docker")
                for m in container.get("volumeMounts", [])
            )
        # The token is mounted where the pod needs the API (not the `helm test` probe, which calls
        # the gateway and the operator only), and nowhere by default on the accounts.
        assert spec["automountServiceAccountToken"] is (not name.endswith("-test-probe")), name
    for sa in find(render(values), "ServiceAccount"):
        assert sa["automountServiceAccountToken"] is False


def test_operator_runs_kopf_with_liveness_and_probes(default_docs: list[dict[str, Any]]) -> None:
    spec = one(default_docs, "Deployment", f"{FULL}-operator")["spec"]
    # One acts (the Lease holder); a rollout's new pod stands by until the old one hands over.
    assert spec["replicas"] == 1 and spec["strategy"]["type"] == "RollingUpdate"
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 1, "maxUnavailable": 0}
    container = spec["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-m", "kopf"]
    assert container["args"] == [
        "run", "--standalone", "--all-namespaces", "--liveness=http://0.0.0.0:8080/healthz",
        "-m", "posttrain_operator.handlers",
    ]  # fmt: skip
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"broker": 8081, "health": 8080, "metrics": 8082}
    assert container["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "broker"}
    env = container_env(container)
    assert env["POSTTRAIN_LEADER_ELECTION_NAMESPACE"]["value"] == NAMESPACE
    assert env["POSTTRAIN_LEADER_ELECTION_NAME"]["value"] == f"{FULL}-operator"
    assert env["POSTTRAIN_LEADER_ELECTION_IDENTITY"]["valueFrom"] == {
        "fieldRef": {"fieldPath": "metadata.name"}
    }
    assert (
        one(render({"operator": {"replicas": 2}}), "Deployment", f"{FULL}-operator")["spec"]["replicas"] == 2
    )
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz", "port": "broker"}
    watched = render({"operator": {"watchNamespaces": [NAMESPACE, "b"]}})
    args = one(watched, "Deployment", f"{FULL}-operator")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--namespace={NAMESPACE}" in args and "--namespace=b" in args and "--all-namespaces" not in args


def test_pull_policy_can_be_never_and_the_tag_defaults_to_the_app_version() -> None:
    docs = render({"image": {"repository": "localhost/po", "tag": "", "pullPolicy": "Never"}})
    for name in ("operator", "gateway"):
        container = one(docs, "Deployment", f"{FULL}-{name}")["spec"]["template"]["spec"]["containers"][0]
        assert container["imagePullPolicy"] == "Never"
        assert container["image"] == "localhost/po:0.1.0"


def test_hf_token_is_only_a_secret_reference_and_only_the_operator_gets_it() -> None:
    text = render_text(HF_VALUES)
    docs = [d for d in yaml.safe_load_all(text) if d]
    assert find(docs, "Secret") == []
    operator = container_env(main_container(docs, f"{FULL}-operator"))
    assert operator["POSTTRAIN_HF_TOKEN"] == {
        "name": "POSTTRAIN_HF_TOKEN",
        "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token", "optional": True}},
    }  # fmt: skip
    # A missing Secret is reported by the running operator, not a pod stuck before start.
    assert operator["POSTTRAIN_HF_JOBS_ENABLED"]["value"] == "true"
    assert "hf-token" in operator["POSTTRAIN_HF_TOKEN_SOURCE"]["value"]
    assert operator["POSTTRAIN_HF_NAMESPACE"]["value"] == "acme"
    gateway = container_env(main_container(docs, f"{FULL}-gateway"))
    refs = [e["valueFrom"]["secretKeyRef"]["name"] for e in gateway.values() if "valueFrom" in e]
    assert refs == [f"{FULL}-orchestrator-token"]  # its own orchestrator token, never the HF one
    # Of the operator's settings the gateway shares only the task registry's: where the tasks' repos
    # are, and the most their jobs may ask for.
    assert [k for k in gateway if k.startswith(("POSTTRAIN_", "HF_"))] == [
        "POSTTRAIN_TASK_ASSETS_NAMESPACE",
        "POSTTRAIN_TASK_ASSETS_REVISION",
        *sorted(f"POSTTRAIN_MAX_JOB_{name.upper()}" for name in JobLimitMaxima.model_fields),
    ]
    # No volume of either pod mounts a Secret.
    for _, spec in pod_specs(docs):
        assert not any("secret" in v for v in spec.get("volumes", []))


def test_task_settings_reach_the_operator_and_the_gateway_alike() -> None:
    settings = {
        "POSTTRAIN_TASK_GSM8K_BASE_MODEL": "Qwen/Qwen3-4B-Base",
        "POSTTRAIN_TASK_GSM8K_STANDIN": False,
    }
    docs = render({**HF_VALUES, "tasks": {"settings": settings}})
    for component in ("operator", "gateway"):
        env = container_env(main_container(docs, f"{FULL}-{component}"))
        assert env["POSTTRAIN_TASK_GSM8K_BASE_MODEL"]["value"] == "Qwen/Qwen3-4B-Base"
        assert env["POSTTRAIN_TASK_GSM8K_STANDIN"]["value"] == "false"


def test_hf_disabled_renders_no_token_reference(default_docs: list[dict[str, Any]]) -> None:
    operator = container_env(main_container(default_docs, f"{FULL}-operator"))
    assert "POSTTRAIN_HF_TOKEN" not in operator and operator["POSTTRAIN_PODS_ENABLED"]["value"] == "false"


def test_the_broker_trusts_exactly_the_gateway_and_the_gateway_finds_the_broker(
    default_docs: list[dict[str, Any]],
) -> None:
    operator = container_env(main_container(default_docs, f"{FULL}-operator"))
    assert json.loads(operator["POSTTRAIN_BROKER_ALLOWED_USERS"]["value"]) == [GATEWAY_SA]
    gateway = one(default_docs, "Deployment", f"{FULL}-gateway")["spec"]["template"]["spec"]
    assert gateway["serviceAccountName"] == f"{FULL}-gateway"
    env = container_env(gateway["containers"][0])
    broker = one(default_docs, "Service", f"{FULL}-broker")
    port = broker["spec"]["ports"][0]["port"]
    assert env["GATEWAY_BROKER_URL"]["value"] == f"http://{FULL}-broker.{NAMESPACE}.svc:{port}"
    assert env["GATEWAY_NAMESPACE"]["value"] == NAMESPACE
    hosts = json.loads(env["GATEWAY_ALLOWED_HOSTS"]["value"])
    assert f"{FULL}-gateway.{NAMESPACE}.svc:*" in hosts
    op_labels = one(default_docs, "Deployment", f"{FULL}-operator")["spec"]["template"]["metadata"]["labels"]
    assert broker["spec"]["selector"].items() <= op_labels.items()


def test_network_policies_admit_only_the_gateway_to_the_broker(default_docs: list[dict[str, Any]]) -> None:
    labels = {
        name: one(default_docs, "Deployment", f"{FULL}-{name}")["spec"]["template"]["metadata"]["labels"]
        for name in ("operator", "gateway")
    }
    policy = one(default_docs, "NetworkPolicy", f"{FULL}-operator")["spec"]
    assert policy["policyTypes"] == ["Ingress"]
    assert policy["podSelector"]["matchLabels"].items() <= labels["operator"].items()
    assert not policy["podSelector"]["matchLabels"].items() <= labels["gateway"].items()
    # The broker's rule; the metrics port's is tests/unit/helm/test_chart_metrics.py's, the `helm test`
    # probe's is tests/unit/helm/test_chart_helm_test.py's.
    probe = "test-probe"

    def component(rule: dict[str, Any]) -> str:
        return str(rule["from"][0]["podSelector"]["matchLabels"]["app.kubernetes.io/component"])

    [rule] = [r for r in policy["ingress"] if r["ports"][0]["port"] != 8082 and component(r) != probe]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}  # the gateway's pods, in this namespace only
    assert peer["podSelector"]["matchLabels"].items() <= labels["gateway"].items()
    assert not peer["podSelector"]["matchLabels"].items() <= labels["operator"].items()
    assert rule["ports"] == [{"protocol": "TCP", "port": 8081}]
    gateway = one(default_docs, "NetworkPolicy", f"{FULL}-gateway")["spec"]
    assert gateway["ingress"] == [{"ports": [{"protocol": "TCP", "port": 8080}]}]
    none = render(
        {
            "gateway": {"enabled": False},
            "metrics": {
                "enabled": False,
                "serviceMonitor": {"enabled": False, "interval": "30s"},
                "dashboard": {"enabled": False},
            },
        }
    )
    assert one(none, "NetworkPolicy", f"{FULL}-operator")["spec"]["ingress"] == []
    assert find(render({"networkPolicy": {"enabled": False}}), "NetworkPolicy") == []


def test_admission_policy_lets_only_the_operator_create_score_jobs(
    default_docs: list[dict[str, Any]],
) -> None:
    policy = one(default_docs, "ValidatingAdmissionPolicy", f"{FULL}-score-jobs")
    assert policy["apiVersion"] == "admissionregistration.k8s.io/v1"
    spec = policy["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"] == [
        {
            "apiGroups": ["posttrain.dev"],
            "apiVersions": ["*"],
            "operations": ["CREATE"],
            "resources": ["agentjobs"],
        }
    ]
    assert "object.spec.purpose == 'score'" in spec["matchConditions"][0]["expression"]
    assert [v["expression"] for v in spec["validations"]] == [f"request.userInfo.username == '{OPERATOR_SA}'"]
    binding = one(default_docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-score-jobs")["spec"]
    assert binding == {"policyName": f"{FULL}-score-jobs", "validationActions": ["Deny"]}
    scoped = render({"admissionPolicy": {"enabled": True, "namespaceSelector": {"matchLabels": {"a": "b"}}}})
    binding = one(scoped, "ValidatingAdmissionPolicyBinding", f"{FULL}-score-jobs")["spec"]
    assert binding["matchResources"] == {"namespaceSelector": {"matchLabels": {"a": "b"}}}


def test_admission_policy_holds_each_provenance_writer_to_its_own_records(
    default_docs: list[dict[str, Any]],
) -> None:
    spec = one(default_docs, "ValidatingAdmissionPolicy", f"{FULL}-provenance-writers")["spec"]
    assert spec["failurePolicy"] == "Fail"
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["provenancerecords"]
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    (rule,) = spec["validations"]
    assert f"'gateway' ? '{GATEWAY_SA}' : '{OPERATOR_SA}'" in rule["expression"]
    binding = one(default_docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-provenance-writers")["spec"]
    assert binding == {"policyName": f"{FULL}-provenance-writers", "validationActions": ["Deny"]}


def test_task_policy_starts_with_no_task_until_the_operator_lists_its_own(
    default_docs: list[dict[str, Any]],
) -> None:
    spec = one(default_docs, "ValidatingAdmissionPolicy", f"{FULL}-tasks")["spec"]
    assert spec["matchConstraints"]["resourceRules"][0]["resources"] == ["episodes"]
    assert spec["matchConstraints"]["resourceRules"][0]["operations"] == ["CREATE"]
    # `helm template` cannot look the live policy up: the list is empty, so nothing passes unchecked.
    assert spec["variables"] == [{"name": "registered", "expression": "[]"}]
    assert [v["expression"] for v in spec["validations"]] == ["object.spec.task in variables.registered"]
    operator = one(default_docs, "Deployment", f"{FULL}-operator")["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in operator["containers"][0]["env"]}
    assert env["POSTTRAIN_TASK_POLICY_NAME"] == f"{FULL}-tasks"
    binding = one(default_docs, "ValidatingAdmissionPolicyBinding", f"{FULL}-tasks")["spec"]
    assert binding == {"policyName": f"{FULL}-tasks", "validationActions": ["Deny"]}


def test_helm_test_hook_dry_runs_an_episode_as_the_gateway(default_docs: list[dict[str, Any]]) -> None:
    pod = one(default_docs, "Pod", f"{FULL}-test")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    spec = pod["spec"]
    assert spec["serviceAccountName"] == f"{FULL}-gateway" and spec["restartPolicy"] == "Never"
    container = spec["containers"][0]
    assert container["command"] == ["kubectl"]
    assert "--dry-run=server" in container["args"]
    config = one(default_docs, "ConfigMap", f"{FULL}-test")
    assert config["metadata"]["annotations"]["helm.sh/hook"] == "test"
    episode = yaml.safe_load(config["data"]["episode.yaml"])
    assert episode["kind"] == "Episode" and episode["metadata"]["namespace"] == NAMESPACE
    assert episode["spec"] == {"task": "t0_artifact", "budgetUSD": "0.01", "backend": "hf-jobs"}
    assert spec["volumes"][0]["configMap"]["name"] == config["metadata"]["name"]


@pytest.mark.parametrize(
    ("release", "values"),
    [("r" * 53, {}), ("pt", {"fullnameOverride": "f" * 63}), ("pt", {"nameOverride": "n" * 63})],
    ids=["longest-release", "longest-fullname-override", "longest-name-override"],
)
def test_names_and_labels_fit_in_63_characters_and_keep_their_component(
    release: str, values: dict[str, Any]
) -> None:
    docs = render({**values, **PODS_AND_HF}, release=release)
    names = [(d["kind"], d["metadata"]["name"]) for d in docs]
    assert len(set(names)) == len(names)
    for d in docs:
        meta = d["metadata"]
        assert len(meta["name"]) <= 63, meta["name"]
        assert meta["name"].endswith(SUFFIXES), meta["name"]
        for value in meta.get("labels", {}).values():
            assert len(value) <= 63, value


def test_chart_crds_are_the_generated_crds() -> None:
    chart_crds = CHART / "crds"
    assert crds.main(["--check", str(chart_crds)]) == 0
    assert sorted(p.name for p in chart_crds.iterdir()) == sorted(p.name for p in (REPO / "crds").iterdir())
    for path in (REPO / "crds").iterdir():
        assert (chart_crds / path.name).read_text() == path.read_text(), path.name


def test_every_environment_variable_is_a_real_setting() -> None:
    """A typo in the chart would silently leave a setting at its default: every POSTTRAIN_* and
    GATEWAY_* variable the chart sets must name a field of the settings it configures."""
    docs = render({**HF_VALUES, "pods": PODS})
    operator_env = container_env(main_container(docs, f"{FULL}-operator"))
    gateway_env = container_env(main_container(docs, f"{FULL}-gateway"))
    operator_fields = set(OperatorSettings.model_fields)
    gateway_fields = set(GatewaySettings.model_fields)
    # Both read the task registry's own settings (graders.tasks.AssetLocation).
    assets = {f"task_assets_{name}" for name in AssetLocation.model_fields}
    assets |= {f"max_job_{name}" for name in JobLimitMaxima.model_fields}
    unknown = [
        n
        for n in operator_env
        if n.startswith("POSTTRAIN_") and n[10:].lower() not in operator_fields | assets
    ]
    unknown += [n for n in gateway_env if n.startswith("GATEWAY_") and n[8:].lower() not in gateway_fields]
    unknown += [n for n in gateway_env if n.startswith("POSTTRAIN_") and n[10:].lower() not in assets]
    assert unknown == []
    assert {n for n in operator_env if n.startswith("POSTTRAIN_")} >= {
        "POSTTRAIN_HF_TOKEN", "POSTTRAIN_HF_NAMESPACE", "POSTTRAIN_HF_ENDPOINT", "POSTTRAIN_HF_IMAGE",
        "POSTTRAIN_BROKER_PORT", "POSTTRAIN_BROKER_ALLOWED_USERS", "POSTTRAIN_PODS_ENABLED",
    }  # fmt: skip
    assert "GATEWAY_ORCHESTRATOR_TOKEN" in gateway_env


def test_the_operator_and_the_gateway_find_the_tasks_repos_in_the_same_place() -> None:
    docs = render({"tasks": {"assetsNamespace": "my-lab", "assetsRevision": "v1"}})
    for component in ("operator", "gateway"):
        env = container_env(main_container(docs, f"{FULL}-{component}"))
        assert env["POSTTRAIN_TASK_ASSETS_NAMESPACE"]["value"] == "my-lab"
        assert env["POSTTRAIN_TASK_ASSETS_REVISION"]["value"] == "v1"
    for bad in ("../x", "a/b", ""):
        error = render_error({"tasks": {"assetsNamespace": "my-lab", "assetsRevision": bad}})
        assert "assetsRevision" in error, error


def test_the_operator_and_the_gateway_hold_tasks_to_the_same_job_limit_maxima() -> None:
    docs = render({"tasks": {"jobLimitMaxima": {"maxOutputBytes": 5 << 40}}})
    for component in ("operator", "gateway"):
        env = container_env(main_container(docs, f"{FULL}-{component}"))
        maxima = {k: v["value"] for k, v in env.items() if k.startswith("POSTTRAIN_MAX_JOB_")}
        assert maxima["POSTTRAIN_MAX_JOB_MAX_OUTPUT_BYTES"] == str(5 << 40)  # not 5.497558e+12
        # What the processes read is what the chart wrote, every field of it.
        read = JobLimitMaxima(**{k.removeprefix("POSTTRAIN_MAX_JOB_").lower(): v for k, v in maxima.items()})
        assert read.max_output_bytes == 5 << 40 and read.max_log_bytes == 16 << 20
    assert "maxOutputBytes" in render_error({"tasks": {"jobLimitMaxima": {"maxOutputBytes": "lots"}}})


def test_pods_backend_mounts_its_store_in_the_operator_only_when_enabled(
    default_docs: list[dict[str, Any]],
) -> None:
    spec = one(render(PODS_AND_HF), "Deployment", f"{FULL}-operator")["spec"]["template"]["spec"]
    assert {"name": "store", "nfs": {"server": "nfs.example", "path": "/store"}} in spec["volumes"]
    assert {"name": "store", "mountPath": "/store"} in spec["containers"][0]["volumeMounts"]
    env = container_env(spec["containers"][0])
    assert json.loads(env["POSTTRAIN_PODS_STORE_VOLUME"]["value"]) == {
        "nfs": {"server": "nfs.example", "path": "/store"}
    }
    assert env["POSTTRAIN_PODS_STORE_PATH"]["value"] == "/store"
    default = one(default_docs, "Deployment", f"{FULL}-operator")["spec"]["template"]["spec"]
    assert [v["name"] for v in default["volumes"]] == ["tmp"]


def test_runtime_classes_render_with_overhead_and_scheduling_and_bad_ones_are_refused() -> None:
    gvisor = {
        "name": "gvisor",
        "handler": "runsc",
        "overhead": {"podFixed": {"cpu": "100m", "memory": "200Mi"}},
        "scheduling": {
            "nodeSelector": {"sandbox.example/gvisor": "true"},
            "tolerations": [{"key": "sandbox", "operator": "Exists", "effect": "NoSchedule"}],
        },
    }
    kata = {"name": "kata", "handler": "kata"}
    docs = render({**PODS_AND_HF, "pods": {**PODS, "runtimeClasses": [gvisor, kata]}})
    rendered = one(docs, "RuntimeClass", "gvisor")
    assert (rendered["apiVersion"], rendered["handler"]) == ("node.k8s.io/v1", "runsc")
    assert rendered["overhead"] == gvisor["overhead"] and rendered["scheduling"] == gvisor["scheduling"]
    assert set(one(docs, "RuntimeClass", "kata")) == {"apiVersion", "kind", "metadata", "handler"}
    assert find(render(PODS_AND_HF), "RuntimeClass") == []  # none unless asked for
    # Which of them sandbox a job (what a task that requires a sandbox may run on) reaches the operator.
    for given, want in (
        ({}, ["gvisor"]),
        ({"sandboxRuntimeClasses": ["gvisor", "kata"]}, ["gvisor", "kata"]),
    ):
        spec = one(render({**PODS_AND_HF, "pods": {**PODS, **given}}), "Deployment", f"{FULL}-operator")
        env = container_env(spec["spec"]["template"]["spec"]["containers"][0])
        raw = json.loads(env["POSTTRAIN_PODS_SANDBOX_RUNTIME_CLASSES"]["value"])
        assert (
            OperatorSettings.model_validate(
                {"pods_sandbox_runtime_classes": raw}
            ).pods_sandbox_runtime_classes
            == want
        )
    for bad, field in (
        ({"name": "gvisor"}, "handler"),
        ({"name": "Not_A_Name", "handler": "runsc"}, "name"),
        ({"name": "gvisor", "handler": "runsc", "overhead": {"cpu": "1"}}, "overhead"),
    ):
        error = render_error({**PODS_AND_HF, "pods": {**PODS, "runtimeClasses": [bad]}})
        assert "runtimeClasses/0" in error and field in error, error


def test_pods_flavors_reach_the_operator_settings_as_rendered() -> None:
    flavors = {
        "cpu-basic": {"cpu": "1", "memory": "2Gi", "cpuRequest": "250m", "priceMicroUSDPerMinute": 167},
        "gpu-a100": {
            "cpu": "8",
            "memory": "64Gi",
            "gpus": 1,
            "priceMicroUSDPerMinute": 40000,
            "nodeSelector": {"pool": "a100"},
            "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
            "runtimeClassName": "gvisor",
            "priorityClassName": "batch-low",
            "queue": "team-a-gpu",
        },
    }
    docs = render({**HF_VALUES, "pods": {**PODS, "flavors": flavors}})
    spec = one(docs, "Deployment", f"{FULL}-operator")["spec"]["template"]["spec"]
    rendered = container_env(spec["containers"][0])["POSTTRAIN_PODS_FLAVORS"]["value"]
    settings = OperatorSettings.model_validate({"pods_flavors": json.loads(rendered)})
    gpu = settings.pods_flavors["gpu-a100"]
    assert (gpu.gpus, gpu.price_micro_usd_per_minute, gpu.queue) == (1, 40000, "team-a-gpu")
    assert gpu.node_selector == {"pool": "a100"} and gpu.runtime_class_name == "gvisor"
    assert settings.pods_flavors["cpu-basic"].cpu_request == "250m"
    # A flavor without a price is refused by the chart's schema, before anything is installed.
    proc = run_helm(
        "template", "pt", str(CHART),
        values={**HF_VALUES, "pods": {**PODS, "flavors": {"free": {"cpu": "1", "memory": "1Gi"}}}},
    )  # fmt: skip
    assert proc.returncode != 0 and "priceMicroUSDPerMinute" in proc.stderr, proc.stderr


def test_the_package_index_reaches_the_operator_and_only_as_a_url() -> None:
    index = "https://pypi-mirror.example/simple/"
    docs = render({**HF_VALUES, "pods": {**PODS, "packageIndex": index, "packageArch": "aarch64"}})
    env = container_env(main_container(docs, f"{FULL}-operator"))
    settings = OperatorSettings.model_validate(
        {"pods_package_index": env["POSTTRAIN_PODS_PACKAGE_INDEX"]["value"],
         "pods_package_arch": env["POSTTRAIN_PODS_PACKAGE_ARCH"]["value"]}
    )  # fmt: skip
    assert (settings.pods_package_index, settings.pods_package_arch) == (index, "aarch64")
    unset = container_env(main_container(render({**HF_VALUES, "pods": PODS}), f"{FULL}-operator"))
    assert "POSTTRAIN_PODS_PACKAGE_INDEX" not in unset
    wrongs = ({"packageIndex": "file:///etc"}, {"packageIndex": "pypi.org/simple"}, {"packageArch": "x86"})
    for wrong in wrongs:
        assert "pods" in render_error({**HF_VALUES, "pods": {**PODS, **wrong}})


def test_the_loopback_seccomp_profile_reaches_the_operator_only_as_a_node_relative_name() -> None:
    profile = "profiles/posttrain-loopback.json"
    docs = render({**HF_VALUES, "pods": {**PODS, "loopbackSeccompProfile": profile}})
    env = container_env(main_container(docs, f"{FULL}-operator"))
    value = env["POSTTRAIN_PODS_LOOPBACK_SECCOMP_PROFILE"]["value"]
    settings = OperatorSettings.model_validate({"pods_loopback_seccomp_profile": value})
    assert settings.pods_loopback_seccomp_profile == profile
    unset = container_env(main_container(render({**HF_VALUES, "pods": PODS}), f"{FULL}-operator"))
    assert "POSTTRAIN_PODS_LOOPBACK_SECCOMP_PROFILE" not in unset  # default: AF_UNIX jobs
    for wrong in ("../../etc/passwd.json", "/var/lib/kubelet/seccomp/x.json", "a/../b.json", "profile.yaml"):
        pods = {**PODS, "loopbackSeccompProfile": wrong}
        assert "loopbackSeccompProfile" in render_error({**HF_VALUES, "pods": pods})


def test_hf_jobs_packages_resolve_against_pypi_unless_the_chart_names_another_index() -> None:
    env = container_env(main_container(render(HF_VALUES), f"{FULL}-operator"))
    assert env["POSTTRAIN_HF_PACKAGE_INDEX"]["value"] == "https://pypi.org/simple/"
    assert "POSTTRAIN_HF_PACKAGE_REPO" not in env  # default: <namespace>/posttrain-packages
    hf = {**HF_VALUES["hfJobs"], "packageIndex": "", "packageRepo": "lab/wheels"}
    env = container_env(main_container(render({**HF_VALUES, "hfJobs": hf}), f"{FULL}-operator"))
    assert "POSTTRAIN_HF_PACKAGE_INDEX" not in env  # jobs with packages are refused
    settings = OperatorSettings.model_validate({"hf_package_repo": env["POSTTRAIN_HF_PACKAGE_REPO"]["value"]})
    assert settings.hf_package_repo == "lab/wheels"
    for wrong in ({"packageIndex": "file:///etc"}, {"packageRepo": "no-slash"}):
        assert "hfJobs" in render_error({**HF_VALUES, "hfJobs": {**HF_VALUES["hfJobs"], **wrong}})


def test_both_deployments_take_affinity_spread_priority_and_pod_labels_never_replacing_the_charts() -> None:
    scheduling = {
        "affinity": {"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": []}},
        "topologySpreadConstraints": [
            {"maxSkew": 1, "topologyKey": "kubernetes.io/hostname", "whenUnsatisfiable": "ScheduleAnyway"}
        ],
        "priorityClassName": "platform-critical",
        "podLabels": {"team": "ml-platform", "app.kubernetes.io/name": "hijacked"},
    }
    values = {**HF_VALUES, "operator": scheduling, "gateway": scheduling}
    docs = render(values)
    default = {name: spec for name, spec in pod_specs(render(HF_VALUES))}
    for component in ("operator", "gateway"):
        deployment = one(docs, "Deployment", f"{FULL}-{component}")
        template = deployment["spec"]["template"]
        spec, labels = template["spec"], template["metadata"]["labels"]
        assert spec["affinity"] == scheduling["affinity"]
        assert spec["topologySpreadConstraints"] == scheduling["topologySpreadConstraints"]
        assert spec["priorityClassName"] == "platform-critical"
        assert labels["team"] == "ml-platform"
        assert labels["app.kubernetes.io/name"] == "posttrain-operator"  # the chart's own label stays
        assert labels["app.kubernetes.io/component"] == component
        unset = default[f"{FULL}-{component}"]
        assert not {"affinity", "topologySpreadConstraints", "priorityClassName"} & set(unset)
    assert "priorityClassName" in render_error({**HF_VALUES, "operator": {"priorityClassName": "Not_A_Name"}})


def test_more_than_one_operator_gets_a_disruption_budget_over_exactly_its_pods() -> None:
    assert not find(render(HF_VALUES), "PodDisruptionBudget")
    docs = render({**HF_VALUES, "operator": {"replicas": 2}})
    (budget,) = find(docs, "PodDisruptionBudget")
    assert budget["spec"]["maxUnavailable"] == 1
    selector = one(docs, "Deployment", f"{FULL}-operator")["spec"]["selector"]["matchLabels"]
    assert budget["spec"]["selector"]["matchLabels"] == selector


def test_hf_jobs_needs_a_launcher_image_it_can_pull_and_is_told_so() -> None:
    hf = {k: v for k, v in HF_VALUES["hfJobs"].items() if k != "image"}
    error = render_error({**HF_VALUES, "hfJobs": hf})
    assert "hfJobs.image is empty" in error and "make images" in error
    operator = main_container(render(HF_VALUES), f"{FULL}-operator")
    assert container_env(operator)["POSTTRAIN_HF_IMAGE"]["value"] == HF_VALUES["hfJobs"]["image"]


def test_json_logs_reach_both_components_and_text_is_the_default() -> None:
    def flags(docs: list[dict[str, Any]]) -> tuple[list[str], str]:
        operator = main_container(docs, f"{FULL}-operator")
        gateway = container_env(main_container(docs, f"{FULL}-gateway"))
        return operator["args"], gateway["GATEWAY_LOG_FORMAT"]["value"]

    args, gateway = flags(render(HF_VALUES))
    assert not [a for a in args if a.startswith("--log-format")] and gateway == "text"
    args, gateway = flags(render({**HF_VALUES, "logging": {"format": "json"}}))
    assert "--log-format=json" in args and gateway == "json"
    assert (
        GatewaySettings.model_validate({"orchestrator_token": "t", "log_format": gateway}).log_format
        == "json"
    )
    assert "logging" in render_error({**HF_VALUES, "logging": {"format": "yaml"}})


def test_hf_package_staging_gets_its_own_sized_disk_and_only_when_packages_are_staged() -> None:
    def staging(values: dict[str, Any]) -> tuple[list[dict[str, Any]], dict[str, dict[str, Any]]]:
        docs = render(values)
        spec = one(docs, "Deployment", f"{FULL}-operator")["spec"]["template"]["spec"]
        volumes = [v for v in spec["volumes"] if v["name"] == "staging"]
        return volumes, container_env(spec["containers"][0])

    volumes, env = staging({**HF_VALUES, "hfJobs": {**HF_VALUES["hfJobs"], "stagingSize": "5Gi"}})
    assert volumes == [{"name": "staging", "emptyDir": {"sizeLimit": "5Gi"}}]
    assert env["POSTTRAIN_HF_STAGING_DIR"]["value"] == "/var/lib/posttrain/staging"
    volumes, env = staging({**HF_VALUES, "hfJobs": {**HF_VALUES["hfJobs"], "packageIndex": ""}})
    assert volumes == [] and "POSTTRAIN_HF_STAGING_DIR" not in env
