"""The pods backend's pure parts: names, the hardened pod, the default-deny policy, mounts, the pod
status mapping, and the operator's own reads of the artifact store (untrusted files)."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client
from posttrain_launcher.spec import load_spec, spec_environment
from posttrain_operator.api.models import AgentJobSpec
from posttrain_operator.backends.base import (
    BackendError,
    JobRequest,
    OutputMount,
    RepoMount,
    StagedWheels,
    UnknownFlavor,
    launcher_env,
)
from posttrain_operator.backends.pods import Flavor, PodsBackend, PodsConfig
from posttrain_operator.backends.pods.manifests import (
    is_default_deny,
    namespace_body,
    network_policy_body,
    pod_body,
)
from posttrain_operator.backends.pods.names import (
    JOB_UID,
    KEY_ANNOTATION,
    KEY_LABEL,
    STORE_RO_VOLUME,
    STORE_RW_VOLUME,
    dns_name,
    episode_namespace,
    label_value,
    pod_name,
)
from posttrain_operator.backends.pods.status import remote_status
from posttrain_operator.backends.pods.store import list_artifacts, prepare_output_dir, read_artifact_file
from posttrain_operator.jobspec import build_request

from graders.tasks import get_task

DNS_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?)?$")
CONFIG = PodsConfig(
    image="launcher:test",
    flavors={"cpu-basic": Flavor("1", "2Gi", 167), "cpu-upgrade": Flavor("4", "8Gi", 500)},
    store_volume={"csi": {"driver": "store.example", "volumeAttributes": {"share": "/posttrain"}}},
    store_path="/unused",
)


def _request(**overrides: Any) -> JobRequest:
    fields: dict[str, Any] = {
        "key": "aj-0b7a2c1e-5b7e-4d0a-9a51-0123456789ab",
        "namespace": "team-a",
        "episode": "ep1",
        "job_name": "job1",
        "flavor": "cpu-basic",
        "timeout_seconds": 900,
        "launcher_spec": {"version": 1, "role": "agent", "script": "print(1)"},
        "repos": (RepoMount("model", "org/base", "rev1", "/inputs/model"),),
        "outputs": OutputMount("team-a/ep1/job1", "/outputs"),
    }
    fields.update(overrides)
    return JobRequest(**fields)


# --- names -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "parts",
    [
        ("team-a", "ep1"),
        ("n" * 63, "e" * 253),
        ("ns", "episode.with.dots"),
        ("UPPER", "--weird__chars--"),
    ],
    ids=["short", "longest-namespace-and-episode", "dotted-episode", "unsafe-characters"],
)
def test_episode_namespace_is_a_deterministic_dns_label(parts: tuple[str, str]) -> None:
    name = episode_namespace("pt", *parts)
    assert DNS_LABEL.match(name) and len(name) <= 63
    assert name == episode_namespace("pt", *parts)
    assert name.startswith("pt-")


def test_names_never_merge_different_inputs() -> None:
    assert episode_namespace("pt", "a-b", "c") != episode_namespace("pt", "a", "b-c")
    long = "x" * 80
    assert dns_name("pt", long + "1") != dns_name("pt", long + "2")  # same truncated head
    assert pod_name("aj-1") != pod_name("aj-2")


def test_pod_name_from_key_is_deterministic_and_valid() -> None:
    key = _request().key
    assert pod_name(key) == pod_name(key) and DNS_LABEL.match(pod_name(key))
    assert DNS_LABEL.match(pod_name("k" * 300))


@pytest.mark.parametrize(
    "text", ["aj-123", "a" * 64, "has/slash", "-leading", "trailing.", "", "ünïcode"],
    ids=["valid-kept", "too-long", "slash", "leading-dash", "trailing-dot", "empty", "non-ascii"],
)  # fmt: skip
def test_label_values_are_always_valid(text: str) -> None:
    value = label_value(text)
    assert LABEL_VALUE.match(value) and len(value) <= 63 and value
    if text == "aj-123":
        assert value == text


# --- the namespace and its NetworkPolicy --------------------------------------------------------


def test_network_policy_denies_all_ingress_and_egress_for_every_pod() -> None:
    policy = network_policy_body(CONFIG, "pt-x")
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    assert is_default_deny(policy)


@pytest.mark.parametrize(
    "spec",
    [
        {"podSelector": {}, "policyTypes": ["Ingress"]},
        {"podSelector": {}, "policyTypes": ["Egress"]},
        {"podSelector": {"matchLabels": {"a": "b"}}, "policyTypes": ["Ingress", "Egress"]},
        {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "egress": [{}]},
        {"podSelector": {}, "policyTypes": ["Ingress", "Egress"], "ingress": [{"from": []}]},
    ],
    ids=["ingress-only", "egress-only", "selects-some-pods", "allows-all-egress", "allows-ingress"],
)
def test_policies_that_let_traffic_through_are_not_default_deny(spec: dict[str, Any]) -> None:
    assert not is_default_deny({"spec": spec})


@pytest.mark.parametrize(
    ("volume", "want_level"),
    [({"csi": {"driver": "d"}}, "restricted"), ({"nfs": {"server": "s", "path": "/p"}}, "baseline")],
    ids=["csi-store-allows-restricted", "nfs-store-needs-baseline"],
)
def test_namespace_enforces_the_strictest_pod_security_level_the_store_allows(
    volume: dict[str, Any], want_level: str
) -> None:
    config = PodsConfig(image="i", flavors={}, store_volume=volume, store_path="/s")
    labels = namespace_body(config, "pt-x", "team-a", "ep1")["metadata"]["labels"]
    assert labels["pod-security.kubernetes.io/enforce"] == want_level
    assert labels["pod-security.kubernetes.io/warn"] == "restricted"


@pytest.mark.parametrize(
    "volume",
    [
        {"persistentVolumeClaim": {"claimName": "store"}},
        {"emptyDir": {}},
        {"nfs": {"server": "s", "path": "/p"}, "csi": {"driver": "d"}},
    ],
    ids=["pvc-is-per-namespace", "emptydir-is-not-shared", "two-sources"],
)
def test_store_volumes_that_episode_namespaces_cannot_share_are_refused(volume: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="store volume"):
        PodsConfig(image="i", flavors={}, store_volume=volume, store_path="/s")


# --- the pod --------------------------------------------------------------------------------


def _container(pod: dict[str, Any]) -> dict[str, Any]:
    (container,) = pod["spec"]["containers"]
    result: dict[str, Any] = container
    return result


def test_pod_is_hardened() -> None:
    pod = pod_body(CONFIG, _request())
    spec, container = pod["spec"], _container(pod)
    assert spec["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": JOB_UID,
        "runAsGroup": JOB_UID,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert "fsGroup" not in spec["securityContext"]  # would chown the shared store
    assert container["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": JOB_UID,
        "runAsGroup": JOB_UID,
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert spec["automountServiceAccountToken"] is False
    assert spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 900
    assert not (spec["hostNetwork"] or spec["hostPID"] or spec["hostIPC"])
    assert container["command"] == ["python", "-m", "posttrain_launcher"]
    assert container["image"] == "launcher:test"
    assert {"name": "scratch", "mountPath": "/tmp"} in container["volumeMounts"]
    # A task's environment image replaces the launcher's.
    in_environment = pod_body(CONFIG, _request(image="registry.example/posttrain-env-trl:1"))
    assert in_environment["spec"]["containers"][0]["image"] == "registry.example/posttrain-env-trl:1"
    assert {"name": "scratch", "emptyDir": {"sizeLimit": "10Gi"}} in spec["volumes"]


def test_pod_env_holds_the_job_spec_the_flavor_and_nothing_secret() -> None:
    entries = _container(pod_body(CONFIG, _request()))["env"]
    env = {e["name"]: e.get("value") for e in entries}
    assert set(env) == {
        "POSTTRAIN_JOB_SPEC",
        "HOME",
        "MEMORY",
        "CPU_CORES",
        "POSTTRAIN_MEMORY_CGROUP",
        "POSTTRAIN_EGRESS_PROBES",
        "POSTTRAIN_EGRESS_BOUND_SECONDS",
        "POSTTRAIN_EGRESS_REPORT",
        "POSTTRAIN_NODE_IP",
    }
    assert env["POSTTRAIN_JOB_SPEC"] == '{"version":1,"role":"agent","script":"print(1)"}'
    # A spec past what one variable may hold (a 250 KiB script) comes in parts the launcher joins.
    large = {"version": 1, "role": "agent", "script": "#" * (250 * 1024)}
    parted = {
        e["name"]: e.get("value") for e in _container(pod_body(CONFIG, _request(launcher_spec=large)))["env"]
    }
    count = int(parted["POSTTRAIN_JOB_SPEC_PARTS"])
    assert "POSTTRAIN_JOB_SPEC" not in parted and count > 1
    assert json.loads("".join(str(parted[f"POSTTRAIN_JOB_SPEC_{i}"]) for i in range(count))) == large
    assert env["POSTTRAIN_MEMORY_CGROUP"] == "job"  # the container's cgroup holds this job alone
    # The launcher's process and memory bounds come from the container's own limits.
    refs = {
        e["name"]: e["valueFrom"]["resourceFieldRef"]
        for e in entries
        if "resourceFieldRef" in e.get("valueFrom", {})
    }
    assert refs == {
        "MEMORY": {"containerName": "job", "resource": "limits.memory", "divisor": "1"},
        "CPU_CORES": {"containerName": "job", "resource": "limits.cpu", "divisor": "1"},
    }


@pytest.mark.parametrize(
    ("flavor", "want"),
    [("cpu-basic", {"cpu": "1", "memory": "2Gi"}), ("cpu-upgrade", {"cpu": "4", "memory": "8Gi"})],
    ids=["basic", "upgrade"],
)
def test_flavor_resources_are_requests_equal_to_limits(flavor: str, want: dict[str, str]) -> None:
    resources = _container(pod_body(CONFIG, _request(flavor=flavor)))["resources"]
    assert resources["requests"] == resources["limits"] == {**want, "ephemeral-storage": "10Gi"}


def test_flavor_places_the_pod_where_the_platform_team_said() -> None:
    gpu = Flavor(
        "8",
        "64Gi",
        9000,
        cpu_request="4",
        memory_request="32Gi",
        gpus=1,
        node_selector={"pool": "a100"},
        tolerations=({"key": "gpu", "operator": "Exists", "effect": "NoSchedule"},),
        runtime_class_name="gvisor",
        priority_class_name="batch-low",
        queue="team-a-gpu",
    )
    config = PodsConfig(
        image="launcher:test", flavors={"gpu": gpu}, store_volume=CONFIG.store_volume, store_path="/unused"
    )
    pod = pod_body(config, _request(flavor="gpu"))
    assert _container(pod)["resources"] == {
        "requests": {"cpu": "4", "memory": "32Gi", "ephemeral-storage": "10Gi", "nvidia.com/gpu": "1"},
        "limits": {"cpu": "8", "memory": "64Gi", "ephemeral-storage": "10Gi", "nvidia.com/gpu": "1"},
    }
    spec = pod["spec"]
    assert spec["nodeSelector"] == {"pool": "a100"}
    assert spec["tolerations"] == [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert (spec["runtimeClassName"], spec["priorityClassName"]) == ("gvisor", "batch-low")
    assert pod["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-gpu"
    # A plain flavor sets none of them.
    plain = pod_body(CONFIG, _request())
    assert not {"nodeSelector", "tolerations", "runtimeClassName", "priorityClassName"} & set(plain["spec"])
    assert "kueue.x-k8s.io/queue-name" not in plain["metadata"]["labels"]


def test_unknown_flavor_is_refused_before_anything_is_built() -> None:
    with pytest.raises(UnknownFlavor, match="cpu-basic, cpu-upgrade"):
        pod_body(CONFIG, _request(flavor="gpu-h100"))


def test_pod_carries_its_key_as_label_and_exact_annotation() -> None:
    request = _request(key="aj-" + "k" * 100)
    meta = pod_body(CONFIG, request)["metadata"]
    assert meta["annotations"][KEY_ANNOTATION] == request.key
    assert meta["labels"][KEY_LABEL] == label_value(request.key) and len(meta["labels"][KEY_LABEL]) <= 63
    assert meta["namespace"] == episode_namespace("pt", "team-a", "ep1")


def test_mounts_are_exactly_the_requests_subpaths_read_only_except_the_own_outputs() -> None:
    request = _request(
        inputs_from=(OutputMount("team-a/ep1/train1", "/inputs/checkpoint", read_only=True),),
        outputs=OutputMount("team-a/ep1/grade1", "/outputs"),
    )
    pod = pod_body(CONFIG, request)
    mounts = [m for m in _container(pod)["volumeMounts"] if m["name"] not in ("scratch", "shm")]
    assert [(m["name"], m["mountPath"], m["subPath"], m["readOnly"]) for m in mounts] == [
        (STORE_RO_VOLUME, "/inputs/model", "repos/model/org/base/rev1", True),
        (STORE_RO_VOLUME, "/inputs/checkpoint", "outputs/team-a/ep1/train1", True),
        (STORE_RW_VOLUME, "/outputs", "outputs/team-a/ep1/grade1", False),
    ]
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes[STORE_RO_VOLUME]["csi"]["readOnly"] is True  # read-only at the source too
    assert "readOnly" not in volumes[STORE_RW_VOLUME]["csi"]


def test_a_score_job_mounts_the_wheels_staged_for_other_jobs_read_only_and_installs_none() -> None:
    other = "aj-11111111-2222-3333-4444-555555555555"
    request = _request(
        launcher_spec={"version": 1, "role": "grader", "script": "grade"},
        wheels_from=(StagedWheels(other, "/inputs/wheels/train1"),),
    )
    pod = pod_body(CONFIG, request)
    namespace = episode_namespace("pt", "team-a", "ep1")
    (mount,) = [m for m in _container(pod)["volumeMounts"] if m["mountPath"] == "/inputs/wheels/train1"]
    assert mount == {
        "name": STORE_RO_VOLUME, "mountPath": "/inputs/wheels/train1",
        "subPath": f"wheels/{namespace}/{pod_name(other)}", "readOnly": True,
    }  # fmt: skip
    env = {e["name"] for e in _container(pod)["env"]}
    assert "POSTTRAIN_PACKAGE_LOCK" not in env and "PIP_FIND_LINKS" not in env


def test_scratch_is_the_tasks_size_and_dev_shm_is_memory_of_the_flavors_size() -> None:
    config = dataclasses.replace(
        CONFIG, flavors={"cpu-basic": dataclasses.replace(CONFIG.flavors["cpu-basic"], shm_size="3Gi")}
    )
    pod = pod_body(config, _request(scratch_bytes=5 << 30))
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["shm"]["emptyDir"] == {"medium": "Memory", "sizeLimit": "3Gi"}
    assert volumes["scratch"]["emptyDir"] == {"sizeLimit": str(5 << 30)}
    assert _container(pod)["resources"]["limits"]["ephemeral-storage"] == str(5 << 30)
    mounted = {m["name"]: m["mountPath"] for m in _container(pod)["volumeMounts"]}
    assert (mounted["shm"], mounted["scratch"]) == ("/dev/shm", "/tmp")
    # Without a task's bound, the chart's default.
    default = {v["name"]: v for v in pod_body(CONFIG, _request())["spec"]["volumes"]}
    assert default["scratch"]["emptyDir"] == {"sizeLimit": CONFIG.scratch_size}


@pytest.mark.parametrize(
    "request_",
    [
        _request(repos=(RepoMount("model", "org/../../etc", "r", "/inputs/model"),)),
        _request(outputs=OutputMount("team-a/../other", "/outputs")),
        _request(inputs_from=(OutputMount("", "/inputs/checkpoint", read_only=True),)),
    ],
    ids=["dotdot-repo", "dotdot-output", "empty-prefix-would-mount-all-outputs"],
)
def test_paths_that_could_leave_their_subtree_are_refused(request_: JobRequest) -> None:
    with pytest.raises(BackendError, match="unsafe store path"):
        pod_body(CONFIG, request_)


def _jobspec_pod(purpose: str) -> dict[str, Any]:
    task = get_task("t0_arithmetic_format")
    raw: dict[str, Any] = {"episode": "ep1", "purpose": purpose, "flavor": "cpu-basic", "timeoutSeconds": 600}
    raw |= {"script": "print(1)"} if purpose == "train" else {"checkpointFrom": "train1"}
    spec = AgentJobSpec.model_validate(raw)
    request = build_request(spec=spec, task=task, namespace="team-a", job_name="j", uid="u1")
    return pod_body(CONFIG, request)


@pytest.mark.parametrize(
    ("purpose", "want_hidden"),
    [("train", False), ("devEval", False), ("score", True)],
    ids=["agent-job-never", "dev-eval-never", "score-job-only"],
)
def test_hidden_split_is_mounted_only_when_jobspec_asks(purpose: str, want_hidden: bool) -> None:
    hidden = get_task("t0_arithmetic_format").hidden_split
    subpaths = {m.get("subPath") for m in _container(_jobspec_pod(purpose))["volumeMounts"]}
    assert (f"repos/{hidden.kind}/{hidden.repo_id}/{hidden.revision}" in subpaths) is want_hidden
    assert "" not in subpaths and "outputs" not in subpaths  # never the store's root or all outputs


# --- pod status -> RemoteStatus -------------------------------------------------------------------

T0, T1 = "2026-11-29T12:00:00Z", "2026-11-29T12:03:20Z"
D0, D1 = datetime(2026, 11, 29, 12, 0, tzinfo=UTC), datetime(2026, 11, 29, 12, 3, 20, tzinfo=UTC)


def _ended(code: int, reason: str) -> dict[str, Any]:
    return {"terminated": {"exitCode": code, "reason": reason, "startedAt": T0, "finishedAt": T1}}


def _pod(phase: str, state: dict[str, Any] | None = None, **status: Any) -> dict[str, Any]:
    containers = [{"name": "job", "state": state}] if state is not None else []
    return {"status": {"phase": phase, "containerStatuses": containers, **status}}


@pytest.mark.parametrize(
    ("pod", "want_stage", "want_raw", "want_started", "want_finished", "want_in_message", "want_code"),
    [
        (_pod("Pending"), "pending", "Pending", None, None, "", None),
        (
            _pod("Pending", {"waiting": {"reason": "ImagePullBackOff", "message": "no such image"}}),
            "pending", "Pending/ImagePullBackOff", None, None, "no such image", None,
        ),
        (
            _pod("Pending", conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                          "message": "0/3 nodes have enough memory"}]),
            "pending", "Pending/Unschedulable", None, None, "enough memory", None,
        ),
        (_pod("Running", {"running": {"startedAt": T0}}), "running", "Running", D0, None, "", None),
        (
            _pod("Succeeded", _ended(0, "Completed")),
            "succeeded", "Succeeded", D0, D1, "", 0,
        ),
        (
            _pod("Failed", _ended(3, "Error")),
            "failed", "Failed/Error", D0, D1, "exited with code 3 (Error)", 3,
        ),
        (
            _pod("Failed", _ended(137, "OOMKilled")),
            "failed", "Failed/OOMKilled", D0, D1, "code 137 (OOMKilled)", 137,
        ),
        (
            _pod("Failed", {"running": {"startedAt": T0}}, reason="DeadlineExceeded",
                 message="Pod was active on the node longer than the specified deadline",
                 conditions=[{"type": "Ready", "status": "False", "lastTransitionTime": T1}]),
            "failed", "Failed/DeadlineExceeded", D0, D1, "DeadlineExceeded: Pod was active", None,
        ),
        (
            _pod("Unknown", {"running": {"startedAt": T0}}),
            "running", "Unknown", D0, None, "not reporting", None,
        ),
    ],
    ids=[
        "pending-no-node", "pending-image-pull", "pending-unschedulable",
        "running-bills-from-container-start", "succeeded", "failed-exit-code", "failed-oom",
        "failed-deadline-without-container-end", "node-unknown",
    ],
)  # fmt: skip
def test_pod_status_maps_to_remote_status(
    pod: dict[str, Any],
    want_stage: str,
    want_raw: str,
    want_started: datetime | None,
    want_finished: datetime | None,
    want_in_message: str,
    want_code: int | None,
) -> None:
    status = remote_status(pod)
    assert status.exit_code == want_code
    assert (status.stage, status.raw_stage) == (want_stage, want_raw)
    assert (status.started_at, status.finished_at) == (want_started, want_finished)
    assert want_in_message in status.message


# --- price ------------------------------------------------------------------------------------


async def test_price_comes_from_settings_and_unknown_flavors_are_clear() -> None:
    async with client.ApiClient() as api:
        backend = PodsBackend(CONFIG, api)
        assert await backend.price("cpu-upgrade") == 500
        with pytest.raises(UnknownFlavor, match="offers: cpu-basic, cpu-upgrade"):
            await backend.price("gpu")
        assert backend.stats.calls == {}  # no API call for a price


# --- the artifact store as the operator sees it ----------------------------------------------------


@pytest.fixture
def store(tmp_path: Path) -> Path:
    out = tmp_path / "outputs/ns/ep/job"
    (out / "sub").mkdir(parents=True)
    (out / "result.json").write_text('{"score": 1}')
    (out / "sub/model.safetensors").write_bytes(b"x" * 100)
    (tmp_path / "secret").write_text("operator-only")
    (out / "link").symlink_to(tmp_path / "secret")
    (out / "linkdir").symlink_to(tmp_path, target_is_directory=True)
    os.mkfifo(out / "fifo")
    return tmp_path


def test_output_dir_is_private_to_the_job_user(tmp_path: Path) -> None:
    if os.geteuid() not in (0, JOB_UID):
        with pytest.raises(BackendError, match="must run as root or uid 10000"):
            prepare_output_dir(str(tmp_path), "ns/ep/job")
        return
    prepare_output_dir(str(tmp_path), "ns/ep/job")
    info = (tmp_path / "outputs/ns/ep/job").stat()
    assert oct(info.st_mode & 0o777) == oct(0o700)
    assert (info.st_uid, info.st_gid) == (JOB_UID, JOB_UID)
    prepare_output_dir(str(tmp_path), "ns/ep/job")  # again: a retried submit keeps what is there


def test_artifacts_list_regular_files_only(store: Path) -> None:
    found = list_artifacts(str(store), "ns/ep/job", limit=100)
    assert [(a.path, a.size) for a in found] == [("result.json", 12), ("sub/model.safetensors", 100)]
    assert len(list_artifacts(str(store), "ns/ep/job", limit=1)) == 1
    assert list_artifacts(str(store), "ns/ep/never-ran", limit=100) == []


def test_read_artifact_reads_a_regular_file(store: Path) -> None:
    assert read_artifact_file(str(store), "ns/ep/job", "result.json", 100) == b'{"score": 1}'
    assert read_artifact_file(str(store), "ns/ep/job", "sub/model.safetensors", 100) == b"x" * 100


@pytest.mark.parametrize(
    ("path", "want_error", "want_match"),
    [
        ("link", BackendError, "not a regular file"),
        ("linkdir/secret", BackendError, "not a regular file"),
        ("fifo", BackendError, "not a regular file"),
        ("../../../../secret", BackendError, "unsafe store path"),
        ("/etc/passwd", BackendError, "unsafe store path"),
        ("missing.json", FileNotFoundError, "missing.json"),
        ("sub/model.safetensors", BackendError, "larger than 10 bytes"),
    ],
    ids=["symlink", "symlinked-dir", "fifo-never-blocks", "dotdot", "absolute", "missing", "too-big"],
)
def test_read_artifact_refuses_what_a_job_could_plant(
    store: Path, path: str, want_error: type[Exception], want_match: str
) -> None:
    with pytest.raises(want_error, match=re.escape(want_match)):
        read_artifact_file(str(store), "ns/ep/job", path, 10)


def test_egress_check_env_lists_the_operator_probes_and_the_node() -> None:
    probes = ({"name": "gateway", "host": "10.96.0.20", "port": 80},)
    config = PodsConfig(
        image="launcher:test",
        flavors=CONFIG.flavors,
        store_volume=CONFIG.store_volume,
        store_path="/unused",
        egress_probes=probes,
        egress_bound_seconds=15,
    )
    entries = {e["name"]: e for e in _container(pod_body(config, _request()))["env"]}
    assert json.loads(entries["POSTTRAIN_EGRESS_PROBES"]["value"]) == list(probes)
    assert entries["POSTTRAIN_EGRESS_BOUND_SECONDS"]["value"] == "15"
    assert entries["POSTTRAIN_EGRESS_REPORT"]["value"] == "/dev/termination-log"
    assert entries["POSTTRAIN_NODE_IP"]["valueFrom"] == {"fieldRef": {"fieldPath": "status.hostIP"}}
    # Turned off, the launcher sees none of it and runs no check.
    off = PodsConfig(
        image="launcher:test",
        flavors=CONFIG.flavors,
        store_volume=CONFIG.store_volume,
        store_path="/unused",
        egress_probes=None,
    )
    names = {e["name"] for e in _container(pod_body(off, _request()))["env"]}
    assert not {n for n in names if "EGRESS" in n or n == "POSTTRAIN_NODE_IP"}


def test_a_loopback_job_runs_under_the_nodes_profile_and_every_other_job_under_runtime_default() -> None:
    profiled = dataclasses.replace(CONFIG, loopback_seccomp_profile="posttrain-loopback.json")
    spec = {"version": 1, "role": "agent", "script": "print(1)", "network": "loopback"}
    loopback = _request(launcher_spec=spec)
    expected = {"type": "Localhost", "localhostProfile": "posttrain-loopback.json"}
    pod = pod_body(profiled, loopback)
    assert pod["spec"]["securityContext"]["seccompProfile"] == expected
    assert _container(pod)["securityContext"]["seccompProfile"] == expected
    # A unix job (graders), or nodes without the profile: the runtime's default, as before.
    for config, request in ((profiled, _request()), (CONFIG, loopback)):
        pod = pod_body(config, request)
        assert pod["spec"]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert _container(pod)["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}


def test_the_launchers_egress_report_is_read_from_the_termination_message() -> None:
    started, finished = "2026-01-01T00:00:00Z", "2026-01-01T00:01:00Z"
    verified = '{"egressVerified": true, "probes": 9, "rounds": 1, "seconds": 1.93, "open": []}'
    ok = remote_status(
        _pod(
            "Succeeded",
            {
                "terminated": {
                    "exitCode": 0,
                    "startedAt": started,
                    "finishedAt": finished,
                    "message": verified,
                }
            },
        )
    )
    assert (ok.stage, ok.egress_verified, ok.egress_message) == (
        "succeeded",
        True,
        "9 probes closed in 1.93s",
    )
    reason = "egress open to canary (tcp 172.18.0.1:9); no job code ran"
    report = json.dumps({"egressVerified": False, "reason": reason, "open": ["canary (tcp 172.18.0.1:9)"]})
    failed = remote_status(
        _pod(
            "Failed",
            {"terminated": {"exitCode": 4, "startedAt": started, "finishedAt": finished, "message": report}},
        )
    )
    assert (failed.stage, failed.egress_verified, failed.exit_code) == ("failed", False, 4)
    assert failed.message.startswith(reason), failed.message
    # Exit 4 with no (or an overwritten) report is still a failed check; a job's own claim to have
    # been verified does not override the launcher's exit code.
    forged = remote_status(
        _pod(
            "Failed",
            {
                "terminated": {
                    "exitCode": 4,
                    "startedAt": started,
                    "finishedAt": finished,
                    "message": verified,
                }
            },
        )
    )
    assert forged.egress_verified is False
    plain = remote_status(
        _pod("Failed", {"terminated": {"exitCode": 1, "startedAt": started, "finishedAt": finished}})
    )
    assert plain.egress_verified is None


@pytest.mark.parametrize("script", ["print(1)", "#" * (250 * 1024), ("# " + "é" * 60 + "\n") * 2000])
def test_the_operator_writes_the_spec_variables_as_the_launcher_reads_them(script: str) -> None:
    # Two images: the operator's writes them (backends/base.py), the launcher's joins them (spec.py).
    request = _request(launcher_spec={"version": 1, "role": "agent", "script": script, "output_dir": "/o"})
    text = json.dumps(request.launcher_spec, separators=(",", ":"))
    assert launcher_env(request) == spec_environment(text)
    assert load_spec(launcher_env(request)).script == script
