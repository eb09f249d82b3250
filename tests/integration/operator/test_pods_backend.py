"""The pods backend against the real devstack API server, and the operator driving it.

The devstack cluster has no node (no kubelet, no scheduler, no CNI): pods are created, validated
and admitted (Pod Security included) but stay Pending forever, and NetworkPolicies are stored but
enforced by nothing. So these tests prove what the API server sees: the order of creation, the
stored specs, find/adopt, status of a Pending pod, deletion. Running, exit codes, logs of a running
container and the policy's effect on traffic need a real cluster (tests/e2e).
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes_asyncio import client, config
from posttrain_operator.backends.base import (
    BackendError,
    Handle,
    JobRequest,
    OutputMount,
    PackagePin,
    RepoMount,
)
from posttrain_operator.backends.pods import Flavor, PodsBackend, PodsConfig
from posttrain_operator.backends.pods.manifests import namespace_body
from posttrain_operator.backends.pods.names import (
    JOB_UID,
    KEY_LABEL,
    MANAGED_LABEL,
    NETWORK_POLICY,
    POD_FINALIZER,
    SOURCE_NAMESPACE_LABEL,
    episode_namespace,
    label_value,
)
from posttrain_operator.backends.wheels import WHEELS_MOUNT

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl, kubectl_json, wait_for, wait_for_async
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    wait_phase,
)
from tests.package_index import build_wheel, serve_index

STORE_VOLUME = {"csi": {"driver": "store.posttrain.example", "volumeAttributes": {"share": "/posttrain"}}}


def _config(store: Path) -> PodsConfig:
    return PodsConfig(
        image="localhost/posttrain-launcher:test",
        flavors={"cpu-basic": Flavor("500m", "1Gi", 167)},
        store_volume=STORE_VOLUME,
        store_path=str(store),
        confirm_timeout_seconds=5.0,
    )


@pytest.fixture
async def api_client(cluster: devcluster.ClusterState) -> AsyncIterator[client.ApiClient]:
    configuration = client.Configuration()
    await config.load_kube_config(config_file=str(cluster.kubeconfig), client_configuration=configuration)
    async with client.ApiClient(configuration=configuration) as api:
        yield api


@pytest.fixture
def backend(api_client: client.ApiClient, tmp_path: Path) -> PodsBackend:
    return PodsBackend(_config(tmp_path / "store"), api_client)


@pytest.fixture
def episode_namespaces(kubectl: Kubectl, namespace: str) -> Iterator[None]:
    """The episode namespaces the backend makes for the test's namespace, deleted afterwards, their
    pods released from the backend's finalizer as `release_episode` does (else they hold them)."""
    yield
    selector = f"{SOURCE_NAMESPACE_LABEL}={namespace}"
    for pod in kubectl_json(kubectl, "get", "pods", "-A", "-l", selector)["items"]:
        meta = pod["metadata"]
        kubectl("-n", meta["namespace"], "patch", "pod", meta["name"], "--type=merge",
                "-p", '{"metadata":{"finalizers":null}}', check=False)  # fmt: skip
    kubectl("delete", "namespace", "-l", selector, "--wait=false", check=False)


def _request(namespace: str, key: str, episode: str = "ep1") -> JobRequest:
    return JobRequest(
        key=key,
        namespace=namespace,
        episode=episode,
        job_name=key,
        flavor="cpu-basic",
        timeout_seconds=600,
        launcher_spec={"version": 1, "role": "agent", "script": "print(1)", "output_dir": "/outputs"},
        repos=(RepoMount("dataset", "local/records", "rev1", "/inputs/records"),),
        outputs=OutputMount(f"{namespace}/{episode}/{key}", "/outputs"),
    )


def _pods_with_key(kubectl: Kubectl, key: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = kubectl_json(kubectl, "get", "pods", "-A", "-l", f"{KEY_LABEL}={key}")[
        "items"
    ]
    return items


async def test_submit_isolates_the_episode_namespace_before_creating_a_hardened_pod(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None, tmp_path: Path
) -> None:
    handle = await backend.submit(_request(namespace, "aj-first"))
    ep_ns = episode_namespace("pt", namespace, "ep1")
    pod_ns, pod_name = handle.backend_job_id.split("/")
    assert pod_ns == ep_ns and handle.output_prefix == f"{namespace}/ep1/aj-first"

    ns = kubectl_json(kubectl, "get", "namespace", ep_ns)
    assert ns["metadata"]["labels"][MANAGED_LABEL] == "posttrain-operator"
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"
    policy = kubectl_json(kubectl, "-n", ep_ns, "get", "networkpolicy", NETWORK_POLICY)
    assert policy["spec"] == {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]}
    pod = kubectl_json(kubectl, "-n", ep_ns, "get", "pod", pod_name)
    # resourceVersions are etcd revisions of one store: they order the three creations.
    versions = [int(o["metadata"]["resourceVersion"]) for o in (ns, policy, pod)]
    assert versions == sorted(versions), f"namespace, policy, pod created out of order: {versions}"

    # The spec as the API server stored it (and Pod Security "restricted" admitted).
    spec = pod["spec"]
    (container,) = spec["containers"]
    assert spec["automountServiceAccountToken"] is False and spec["enableServiceLinks"] is False
    assert spec["restartPolicy"] == "Never" and spec["activeDeadlineSeconds"] == 600
    assert spec["securityContext"]["runAsNonRoot"] is True and spec["securityContext"]["runAsUser"] == JOB_UID
    assert container["securityContext"]["allowPrivilegeEscalation"] is False
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert container["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    assert container["resources"]["requests"] == container["resources"]["limits"]
    assert container["command"] == ["python", "-m", "posttrain_launcher"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert json.loads(env["POSTTRAIN_JOB_SPEC"])["script"] == "print(1)"
    # The API server accepted the Downward API references the launcher's bounds and its egress
    # check's node address come from.
    assert {e["name"] for e in container["env"] if "valueFrom" in e} == {
        "MEMORY",
        "CPU_CORES",
        "POSTTRAIN_NODE_IP",
    }
    assert pod["status"]["phase"] == "Pending"  # no node: it never runs here

    out = tmp_path / "store" / "outputs" / namespace / "ep1" / "aj-first"
    assert out.is_dir() and out.stat().st_uid == JOB_UID  # writable by the job, made before the pod


async def test_packages_are_staged_before_the_pod_which_mounts_them_and_go_with_the_episode(
    api_client: client.ApiClient, kubectl: Kubectl, namespace: str, episode_namespaces: None, tmp_path: Path
) -> None:
    # ptprobe depends on ptdep, and on numpy, which the launcher's image holds.
    wheel = build_wheel(tmp_path, "ptprobe", "1.0", "VALUE = 1\n", requires=["ptdep>=1", "numpy>=1"])
    dep = build_wheel(tmp_path, "ptdep", "1.2", "VALUE = 2\n")
    with serve_index("127.0.0.1", {"ptprobe": [wheel], "ptdep": [dep]}) as index:
        config = dataclasses.replace(_config(tmp_path / "store"), package_index=index.url)
        staging = PodsBackend(config, api_client)
        request = _request(namespace, "aj-pkgs")
        request.launcher_spec["packages"] = ["ptprobe==1.0"]
        handle = await staging.submit(request)
    pod_ns, pod_name = handle.backend_job_id.split("/")
    staged = tmp_path / "store" / "wheels" / pod_ns / pod_name
    assert (staged / wheel.name).read_bytes() == wheel.read_bytes()
    assert (staged / dep.name).read_bytes() == dep.read_bytes()
    digests = {w: hashlib.sha256(w.read_bytes()).hexdigest() for w in (wheel, dep)}
    pins = (PackagePin("ptprobe", "1.0", digests[wheel]), PackagePin("ptdep", "1.2", digests[dep]))
    assert handle.packages == pins
    assert "numpy" not in (staged / "requirements.lock").read_text()
    # The stored pod: wheels mounted read-only from the store, pip told to use them and no index.
    pod = kubectl_json(kubectl, "-n", pod_ns, "get", "pod", pod_name)
    (container,) = pod["spec"]["containers"]
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == WHEELS_MOUNT]
    assert mount["readOnly"] is True and mount["subPath"] == f"wheels/{pod_ns}/{pod_name}"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (env["PIP_NO_INDEX"], env["PIP_FIND_LINKS"]) == ("1", WHEELS_MOUNT)
    assert env["POSTTRAIN_PACKAGE_LOCK"] == f"{WHEELS_MOUNT}/requirements.lock"
    assert await staging.cancel(handle)
    await wait_for_async(
        lambda: staging.release_episode(namespace, "ep1"), 120, 0.5, "the episode's namespace deleted"
    )
    assert not (tmp_path / "store" / "wheels" / pod_ns).exists()


async def test_the_api_server_refuses_a_pod_that_lost_its_hardening(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None
) -> None:
    """Defense in depth: the namespace's Pod Security level, not only our builder, keeps pods hardened."""
    handle = await backend.submit(_request(namespace, "aj-psa"))
    ep_ns = handle.backend_job_id.split("/")[0]
    plain = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "plain"},
             "spec": {"containers": [{"name": "c", "image": "busybox"}]}}  # fmt: skip
    refused = kubectl(
        "-n", ep_ns, "apply", "--dry-run=server", "-f", "-", input=json.dumps(plain), check=False
    )
    assert refused.returncode != 0 and 'violates PodSecurity "restricted' in refused.stderr


async def test_find_by_key_and_a_second_submit_adopts_the_same_pod(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None
) -> None:
    request = _request(namespace, "aj-adopt")
    assert await backend.find(request.key) is None
    first = await backend.submit(request)
    assert await backend.find(request.key) == first
    again = await backend.submit(request)  # e.g. after a crash between create and status write
    assert again == first
    assert len(_pods_with_key(kubectl, label_value(request.key))) == 1
    assert backend.stats.calls["create_namespaced_pod"] == 2  # the second one got 409 and adopted


async def test_status_many_is_one_list_call_and_maps_pending_and_missing_pods(
    backend: PodsBackend, namespace: str, episode_namespaces: None
) -> None:
    handles = [await backend.submit(_request(namespace, f"aj-s{i}")) for i in range(3)]
    missing = Handle(f"{handles[0].backend_job_id.split('/')[0]}/job-never-made")
    before = backend.stats.calls.get("list_pod_for_all_namespaces", 0)
    statuses = await backend.status_many([*handles, missing])
    assert backend.stats.calls["list_pod_for_all_namespaces"] == before + 1
    for handle in handles:
        status = statuses[handle.backend_job_id]
        assert (status.stage, status.raw_stage, status.started_at) == ("pending", "Pending", None)
    assert statuses[missing.backend_job_id].stage == "lost"


def end_pod_as_the_kubelet_would(kubectl: Kubectl, backend_job_id: str, exit_code: int) -> None:
    """What a kubelet writes when the job container exits: there is none here, so the test writes it
    (the status subresource, validated by the API server like the kubelet's own write)."""
    ep_ns, name = backend_job_id.split("/")
    image = kubectl_json(kubectl, "-n", ep_ns, "get", "pod", name)["spec"]["containers"][0]["image"]
    terminated = {
        "exitCode": exit_code,
        "reason": "Completed" if exit_code == 0 else "Error",
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:01:30Z",
    }
    status = {
        "phase": "Succeeded" if exit_code == 0 else "Failed",
        "containerStatuses": [
            {"name": "job", "image": image, "imageID": "", "ready": False, "restartCount": 0,
             "state": {"terminated": terminated}},
        ],
    }  # fmt: skip
    kubectl("-n", ep_ns, "patch", "pod", name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))  # fmt: skip


async def test_status_many_reports_the_exit_code_the_kubelet_wrote(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None
) -> None:
    failed = await backend.submit(_request(namespace, "aj-exit3"))
    succeeded = await backend.submit(_request(namespace, "aj-exit0"))
    end_pod_as_the_kubelet_would(kubectl, failed.backend_job_id, 3)
    end_pod_as_the_kubelet_would(kubectl, succeeded.backend_job_id, 0)
    statuses = await backend.status_many([failed, succeeded])
    assert (statuses[failed.backend_job_id].stage, statuses[failed.backend_job_id].exit_code) == ("failed", 3)
    ok = statuses[succeeded.backend_job_id]
    assert (ok.stage, ok.exit_code, (ok.finished_at - ok.started_at).seconds) == ("succeeded", 0, 90)


async def test_cancel_deletes_the_pod_and_confirms_it_never_ran(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None
) -> None:
    """Never bound to a node, it is final at once; the backend's finalizer keeps it, deleted, until
    its episode's namespace goes."""
    handle = await backend.submit(_request(namespace, "aj-cancel"))
    assert await backend.cancel(handle) is True
    ep_ns, name = handle.backend_job_id.split("/")
    held = kubectl_json(kubectl, "-n", ep_ns, "get", "pod", name)["metadata"]
    assert held["deletionTimestamp"] and held["finalizers"] == [POD_FINALIZER]
    final = (await backend.status_many([handle]))[handle.backend_job_id]
    assert (final.stage, final.started_at) == ("cancelled", None)
    deletes = backend.stats.calls["delete_namespaced_pod"]
    assert await backend.cancel(handle) is True  # idempotent, and no second delete
    assert backend.stats.calls["delete_namespaced_pod"] == deletes
    assert await backend.logs(handle, 10) == []


def _bind(kubectl: Kubectl, backend_job_id: str, node: str) -> None:
    """What the scheduler does (there is none here): the pods/binding subresource. No Node object is
    needed; the pod GC would only collect the pod 40 s after it saw the node missing."""
    ep_ns, name = backend_job_id.split("/")
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": name},
               "target": {"apiVersion": "v1", "kind": "Node", "name": node}}  # fmt: skip
    # (kubectl: the Python client fails to read the API server's answer, a Status, as a Binding.)
    kubectl("create", "--raw", f"/api/v1/namespaces/{ep_ns}/pods/{name}/binding", "-f", "-",
            input=json.dumps(binding))  # fmt: skip


def kill_pod_as_the_kubelet_would(kubectl: Kubectl, backend_job_id: str, started: str, ended: str) -> None:
    """What a kubelet writes once it has killed the container of a deleted pod."""
    ep_ns, name = backend_job_id.split("/")
    image = kubectl_json(kubectl, "-n", ep_ns, "get", "pod", name)["spec"]["containers"][0]["image"]
    terminated = {"exitCode": 137, "reason": "Error", "startedAt": started, "finishedAt": ended}
    status = {"phase": "Failed", "containerStatuses": [
        {"name": "job", "image": image, "imageID": "", "ready": False, "restartCount": 0,
         "state": {"terminated": terminated}}]}  # fmt: skip
    kubectl("-n", ep_ns, "patch", "pod", name, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": status}))  # fmt: skip


async def test_a_cancelled_pod_is_billed_from_the_start_its_kubelet_reports_as_it_kills_it(
    api_client: client.ApiClient, kubectl: Kubectl, namespace: str, episode_namespaces: None, tmp_path: Path
) -> None:
    """The pods chaos soak's bug (docs/benchmarks.md, seed 2): the cancel read a pod on its node still
    Pending (its kubelet restarting) while its container ran, and the job was settled at nothing.
    The finalizer keeps the deleted pod until the backend has read the container's start and end."""
    config = dataclasses.replace(_config(tmp_path / "store"), confirm_timeout_seconds=120.0)
    backend = PodsBackend(config, api_client)
    handle = await backend.submit(_request(namespace, "aj-killed"))
    job_id = handle.backend_job_id
    _bind(kubectl, job_id, "node-a")
    ep_ns, name = job_id.split("/")
    core = client.CoreV1Api(api_client)

    async def deleted() -> bool:
        pod = await core.read_namespaced_pod(name, ep_ns)
        return pod.metadata.deletion_timestamp is not None

    cancelling = asyncio.create_task(backend.cancel(handle))
    await wait_for_async(deleted, 30, 0.1, "the pod deleted")
    pending = (await backend.status_many([handle]))[job_id]
    assert (pending.stage, pending.started_at) == ("pending", None)  # not final: neither settled nor lost
    assert not cancelling.done()
    kill_pod_as_the_kubelet_would(kubectl, job_id, "2026-01-01T00:00:10Z", "2026-01-01T00:01:40Z")
    assert await cancelling is True
    # The kubelet's last word on a pod it has ended: its delete with no grace. The finalizer holds it.
    kubectl("-n", ep_ns, "delete", "pod", name, "--grace-period=0", "--force", "--wait=false")
    for reader in (backend, PodsBackend(config, api_client)):  # and an operator restarted since
        final = (await reader.status_many([handle]))[job_id]
        assert (final.stage, final.raw_stage) == ("cancelled", "Deleted")
        assert final.started_at is not None and (final.finished_at - final.started_at).seconds == 90
    await wait_for_async(
        lambda: backend.release_episode(namespace, "ep1"), 120, 0.5, "the episode's namespace deleted"
    )
    gone = kubectl("-n", ep_ns, "get", "pod", name, check=False)
    assert gone.returncode != 0 and "NotFound" in gone.stderr
    after = (await backend.status_many([handle]))[job_id]  # the pod gone: what was read stays
    assert (after.stage, after.started_at) == ("cancelled", final.started_at)


async def test_logs_of_a_pod_that_never_started_are_empty(
    backend: PodsBackend, namespace: str, episode_namespaces: None
) -> None:
    handle = await backend.submit(_request(namespace, "aj-logs"))
    assert await backend.logs(handle, 10) == []


async def test_refuses_a_namespace_that_is_not_this_operators(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None
) -> None:
    ep_ns = episode_namespace("pt", namespace, "ep1")
    kubectl("create", "namespace", ep_ns)
    kubectl("label", "namespace", ep_ns, f"{SOURCE_NAMESPACE_LABEL}={namespace}")  # for clean-up only
    with pytest.raises(BackendError, match="not this operator's namespace") as refused:
        await backend.submit(_request(namespace, "aj-squat"))
    assert not refused.value.transient
    assert _pods_with_key(kubectl, "aj-squat") == []


async def test_refuses_to_create_a_pod_when_another_policy_could_allow_traffic(
    backend: PodsBackend, kubectl: Kubectl, namespace: str, episode_namespaces: None
) -> None:
    ep_ns = episode_namespace("pt", namespace, "ep1")
    kubectl("create", "-f", "-", input=json.dumps(namespace_body(backend.config, ep_ns, namespace, "ep1")))
    allow_all = {"apiVersion": "networking.k8s.io/v1", "kind": "NetworkPolicy",
                 "metadata": {"name": "allow-all", "namespace": ep_ns},
                 "spec": {"podSelector": {}, "policyTypes": ["Egress"], "egress": [{}]}}  # fmt: skip
    kubectl("create", "-f", "-", input=json.dumps(allow_all))
    with pytest.raises(BackendError, match="not isolated"):
        await backend.submit(_request(namespace, "aj-leaky"))
    assert _pods_with_key(kubectl, "aj-leaky") == []
    kubectl_json(kubectl, "-n", ep_ns, "get", "networkpolicy", NETWORK_POLICY)  # ours was still made


# --- the operator with the pods backend -----------------------------------------------------------


@pytest.fixture
def pods_operator(
    cluster: devcluster.ClusterState,
    crds: None,
    emulator: HfEmulator,
    tmp_path: Path,
    namespace: str,
    episode_namespaces: None,
) -> Iterator[OperatorProcess]:
    op = OperatorProcess(
        cluster,
        emulator,
        tmp_path,
        namespace,
        POSTTRAIN_PODS_ENABLED="true",
        POSTTRAIN_PODS_IMAGE="localhost/posttrain-launcher:test",
        POSTTRAIN_PODS_STORE_VOLUME=json.dumps(STORE_VOLUME),
        POSTTRAIN_PODS_STORE_PATH=str(tmp_path / "store"),
    ).start()
    try:
        yield op
    finally:
        op.stop()
        sys.stderr.write(op.logs()[-8000:])


def running_pod_job(kubectl: Kubectl, namespace: str) -> dict[str, Any]:
    """Episode ep1 on the pods backend, and its job job1 once the operator made its pod."""
    apply(kubectl, namespace, episode_manifest("ep1", backend="pods"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
    return wait_phase(kubectl, namespace, "agentjob", "job1", {"Running"})


def test_operator_runs_a_job_as_a_pod_and_deleting_the_episode_removes_it(
    kubectl: Kubectl, namespace: str, pods_operator: OperatorProcess
) -> None:
    job = running_pod_job(kubectl, namespace)
    ep_ns, pod_name = job["status"]["backendJobId"].split("/")
    assert ep_ns == episode_namespace("pt", namespace, "ep1")
    pod = kubectl_json(kubectl, "-n", ep_ns, "get", "pod", pod_name)
    assert pod["metadata"]["annotations"]["posttrain.dev/key"] == job["status"]["idempotencyKey"]
    assert pod["status"]["phase"] == "Pending"  # no node in devstack
    # The poller's status_many saw it: the pod's own phase becomes the job's backendStage.
    wait_for(
        lambda: get(kubectl, namespace, "agentjob", "job1")["status"].get("backendStage") == "Pending",
        what="the poller to report the pod's phase",
    )

    kubectl("-n", namespace, "delete", "episode", "ep1", "--wait=false")
    wait_for(
        lambda: kubectl("-n", ep_ns, "get", "pod", pod_name, check=False).returncode != 0,
        timeout=60,
        what="the job's pod to be deleted",
    )
    wait_for(
        lambda: kubectl("-n", namespace, "get", "episode", "ep1", check=False).returncode != 0,
        timeout=60,
        what="the episode to be gone",
    )
    # With every job confirmed gone, the episode's namespace goes too (it may still be terminating).
    wait_for(
        lambda: (ns := kubectl("get", "namespace", ep_ns, "-o", "json", check=False)).returncode != 0
        or '"deletionTimestamp"' in ns.stdout,
        timeout=60,
        what="the episode namespace to be released",
    )


def test_the_operator_records_the_exit_code_of_a_pod_job(
    kubectl: Kubectl, namespace: str, pods_operator: OperatorProcess
) -> None:
    job = running_pod_job(kubectl, namespace)
    end_pod_as_the_kubelet_would(kubectl, job["status"]["backendJobId"], 3)
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded", "Failed"}, timeout=120)
    status = job["status"]
    assert (status["phase"], status["reason"], status["exitCode"]) == ("Failed", "JobFailed", 3), status
    assert "container exited with code 3" in status["message"]
    assert status["billedSeconds"] == 90  # from the container's start and end, as the kubelet wrote them


def test_a_job_deleted_unsettled_is_settled_at_its_reservation_and_the_ended_episode_released(
    kubectl: Kubectl, namespace: str, pods_operator: OperatorProcess
) -> None:
    """A user removes the operator's finalizer from a running job and deletes it, so no delete handler
    settles it (the operator is down meanwhile, so it cannot put its finalizer back first). Once the
    episode ends, the job's entry is settled at its reservation and the episode's namespace goes."""
    apply(kubectl, namespace, episode_manifest("ep1", backend="pods", limits={"maxSteps": 1}))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Running"})
    reserved = job["status"]["reservedMicroUSD"]
    assert reserved > 0
    ep_ns = job["status"]["backendJobId"].split("/")[0]

    pods_operator.stop()
    kubectl("-n", namespace, "patch", "agentjob", "job1", "--type=json",
            "-p", '[{"op": "remove", "path": "/metadata/finalizers"}]')  # fmt: skip
    kubectl("-n", namespace, "delete", "agentjob", "job1", "--wait=true", "--timeout=30s")
    pods_operator.start().wait_ready()
    # What the gateway does on a tool call: the step limit is reached and the episode ends.
    kubectl("-n", namespace, "patch", "episode", "ep1", "--subresource=status", "--type=merge",
            "-p", '{"status": {"steps": 1}}')  # fmt: skip
    wait_phase(kubectl, namespace, "episode", "ep1", {"Completed"})

    released = wait_for(
        lambda: (e := get(kubectl, namespace, "episode", "ep1"))["status"].get("backendReleased") and e,
        timeout=120,
        what="the ended episode to release its namespace",
    )
    ledger = released["status"]["ledger"]
    assert ledger["entries"]["job1"] == {"reservedMicroUSD": reserved, "settledMicroUSD": reserved,
                                         "platform": False}  # fmt: skip
    assert (ledger["reservedMicroUSD"], ledger["settledMicroUSD"]) == (0, reserved)
    assert kubectl("get", "namespace", ep_ns, check=False).returncode != 0  # its pod went with it
    event = wait_for(
        lambda: kubectl_json(kubectl, "-n", namespace, "get", "events",
                             "--field-selector=involvedObject.name=ep1,reason=SettledAtReservation")["items"],
        what="the episode's SettledAtReservation event",
    )  # fmt: skip
    assert "job1" in event[0]["message"] and event[0]["type"] == "Warning"
