"""Pure builders of what the pods backend creates: the episode namespace, its default-deny
NetworkPolicy, and the hardened job pod. No I/O; unit-tested."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from posttrain_operator.backends.base import JobRequest, UnknownFlavor, launcher_env
from posttrain_operator.backends.pods.config import Flavor, PodsConfig
from posttrain_operator.backends.pods.names import (
    CONTAINER,
    EPISODE_ANNOTATION,
    EPISODE_LABEL,
    JOB_LABEL,
    JOB_UID,
    KEY_ANNOTATION,
    KEY_LABEL,
    MANAGED_LABEL,
    NETWORK_POLICY,
    POD_FINALIZER,
    PREFIX_ANNOTATION,
    SCRATCH_VOLUME,
    SHM_VOLUME,
    SOURCE_NAMESPACE_LABEL,
    STORE_RO_VOLUME,
    STORE_RW_VOLUME,
    episode_namespace,
    label_value,
    output_subpath,
    pod_name,
    repo_subpath,
    wheels_subpath,
)
from posttrain_operator.backends.wheels import WHEELS_MOUNT, install_env


def namespace_body(config: PodsConfig, name: str, namespace: str, episode: str) -> dict[str, Any]:
    pss = "pod-security.kubernetes.io"
    return {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": name,
            "labels": {
                MANAGED_LABEL: label_value(config.instance),
                SOURCE_NAMESPACE_LABEL: label_value(namespace),
                EPISODE_LABEL: label_value(episode),
                f"{pss}/enforce": config.pod_security_level,
                f"{pss}/enforce-version": "latest",
                f"{pss}/warn": "restricted",
                f"{pss}/audit": "restricted",
            },
            "annotations": {EPISODE_ANNOTATION: f"{namespace}/{episode}"},
        },
    }


def network_policy_body(config: PodsConfig, namespace: str) -> dict[str, Any]:
    # An empty podSelector selects every pod; both policy types with no rules allow nothing.
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": {
            "name": NETWORK_POLICY,
            "namespace": namespace,
            "labels": {MANAGED_LABEL: label_value(config.instance)},
        },
        "spec": {"podSelector": {}, "policyTypes": ["Ingress", "Egress"]},
    }


def is_default_deny(policy: Mapping[str, Any]) -> bool:
    spec = policy.get("spec") or {}
    selector = spec.get("podSelector") or {}
    return (
        not selector.get("matchLabels")
        and not selector.get("matchExpressions")
        and {"Ingress", "Egress"} <= set(spec.get("policyTypes") or [])
        and not spec.get("ingress")
        and not spec.get("egress")
    )


def _read_only_source(source: Mapping[str, Any]) -> dict[str, Any]:
    # Read-only at the source as well as at the mount, where the volume type has the field.
    ((kind, spec),) = source.items()
    spec = dict(spec)
    if kind != "hostPath":
        spec["readOnly"] = True
    return {kind: spec}


def store_mounts(request: JobRequest) -> list[dict[str, Any]]:
    """Exactly what the request lists (jobspec decides what a job may see; this never widens it)."""
    mounts = [
        {
            "name": STORE_RO_VOLUME,
            "mountPath": repo.mount_path,
            "subPath": repo_subpath(repo.kind, repo.repo_id, repo.revision),
            "readOnly": True,
        }
        for repo in request.repos
    ]
    mounts += [
        {
            "name": STORE_RO_VOLUME,
            "mountPath": m.mount_path,
            "subPath": output_subpath(m.prefix),
            "readOnly": True,
        }
        for m in request.inputs_from
    ]
    if request.outputs is not None:
        out = request.outputs
        mounts.append(
            {
                "name": STORE_RO_VOLUME if out.read_only else STORE_RW_VOLUME,
                "mountPath": out.mount_path,
                "subPath": output_subpath(out.prefix),
                "readOnly": out.read_only,
            }
        )
    return mounts


def wheels_mount(namespace: str, key: str, mount_path: str = WHEELS_MOUNT) -> dict[str, Any]:
    """The wheels the operator staged for the packages of the job of `key` (wheels.py), read-only: the
    job's own, or (a score job) those of the jobs it screens."""
    return {
        "name": STORE_RO_VOLUME,
        "mountPath": mount_path,
        "subPath": wheels_subpath(namespace, key),
        "readOnly": True,
    }


def _package_env(request: JobRequest) -> list[dict[str, Any]]:
    """pip in the launcher installs the staged wheels and asks no index (the pod has no egress)."""
    if not request.launcher_spec.get("packages"):
        return []
    return [{"name": name, "value": value} for name, value in install_env().items()]


def pod_labels(config: PodsConfig, request: JobRequest) -> dict[str, str]:
    return {
        MANAGED_LABEL: label_value(config.instance),
        KEY_LABEL: label_value(request.key),
        SOURCE_NAMESPACE_LABEL: label_value(request.namespace),
        EPISODE_LABEL: label_value(request.episode),
        JOB_LABEL: label_value(request.job_name),
    }


SECCOMP = {"type": "RuntimeDefault"}


def seccomp_profile(config: PodsConfig, request: JobRequest) -> dict[str, str]:
    """RuntimeDefault, or for a loopback job the nodes' Localhost profile: the same rules plus the one
    `unshare` its launcher makes the job's namespace with (devstack/kind/seccomp.py)."""
    if request.launcher_spec.get("network") == "loopback" and config.loopback_seccomp_profile:
        return {"type": "Localhost", "localhostProfile": config.loopback_seccomp_profile}
    return dict(SECCOMP)


GPU_RESOURCE = "nvidia.com/gpu"
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TERMINATION_LOG = "/dev/termination-log"


def _scratch_size(config: PodsConfig, request: JobRequest) -> str:
    """The task's scratch bound for the job, or the chart's default."""
    return str(request.scratch_bytes) if request.scratch_bytes else config.scratch_size


def _volumes(
    config: PodsConfig, request: JobRequest, flavor: Flavor, mounts: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Scratch, /dev/shm, and the store once read-only and once writable where a mount needs it."""
    used = {m["name"] for m in mounts}
    scratch = {"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": _scratch_size(config, request)}}
    shm = {"name": SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": flavor.shm_size}}
    volumes: list[dict[str, Any]] = [scratch, shm]
    if STORE_RO_VOLUME in used:
        volumes.append({"name": STORE_RO_VOLUME, **_read_only_source(config.store_volume)})
    if STORE_RW_VOLUME in used:
        volumes.append({"name": STORE_RW_VOLUME, **dict(config.store_volume)})
    return volumes


def pod_body(config: PodsConfig, request: JobRequest) -> dict[str, Any]:
    """A job's Pod, whole. The manifest is in one piece on purpose: it reads top to bottom as the API
    server receives it, and every security field of it is in view at once (the flavor's resources and
    placement are below)."""
    flavor = config.flavors.get(request.flavor)
    if flavor is None:
        raise UnknownFlavor(request.flavor, list(config.flavors))
    namespace = episode_namespace(config.namespace_prefix, request.namespace, request.episode)
    mounts = store_mounts(request)
    if request.launcher_spec.get("packages"):
        mounts.append(wheels_mount(namespace, request.key))
    mounts += [wheels_mount(namespace, staged.key, staged.mount_path) for staged in request.wheels_from]
    labels = pod_labels(config, request)
    if flavor.queue:
        labels[KUEUE_QUEUE_LABEL] = flavor.queue
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(request.key),
            "namespace": namespace,
            "labels": labels,
            "finalizers": [POD_FINALIZER],
            "annotations": {
                KEY_ANNOTATION: request.key,
                EPISODE_ANNOTATION: f"{request.namespace}/{request.episode}",
                PREFIX_ANNOTATION: request.outputs.prefix if request.outputs else "",
            },
        },
        "spec": {
            "restartPolicy": "Never",
            "activeDeadlineSeconds": request.timeout_seconds,
            "terminationGracePeriodSeconds": 5,  # the launcher forwards SIGTERM and kills the group
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "hostNetwork": False,
            "hostPID": False,
            "hostIPC": False,
            # No fsGroup: the kubelet would chown the whole shared store on every pod start.
            "securityContext": {
                "runAsNonRoot": True,
                "runAsUser": JOB_UID,
                "runAsGroup": JOB_UID,
                "seccompProfile": seccomp_profile(config, request),
            },
            "containers": [_container(config, request, _resources(config, request, flavor), mounts)],
            "volumes": _volumes(config, request, flavor, mounts),
            **_placement(flavor),
        },
    }


def _resources(config: PodsConfig, request: JobRequest, flavor: Flavor) -> dict[str, Any]:
    """The container's requests and limits: the flavor's, the scratch as ephemeral storage."""
    limits = {"cpu": flavor.cpu, "memory": flavor.memory, "ephemeral-storage": _scratch_size(config, request)}
    requests = {
        **limits,
        "cpu": flavor.cpu_request or flavor.cpu,
        "memory": flavor.memory_request or flavor.memory,
    }
    if flavor.gpus:
        # Extended resources cannot be overcommitted: the request must equal the limit.
        limits[GPU_RESOURCE] = requests[GPU_RESOURCE] = str(flavor.gpus)
    return {"requests": requests, "limits": limits}


def _placement(flavor: Flavor) -> dict[str, Any]:
    """Where the flavor's pods may run, and under which runtime and priority."""
    placement: dict[str, Any] = {}
    if flavor.node_selector:
        placement["nodeSelector"] = dict(flavor.node_selector)
    if flavor.tolerations:
        placement["tolerations"] = [dict(t) for t in flavor.tolerations]
    if flavor.runtime_class_name:
        placement["runtimeClassName"] = flavor.runtime_class_name
    if flavor.priority_class_name:
        placement["priorityClassName"] = flavor.priority_class_name
    return placement


def _egress_env(config: PodsConfig) -> list[dict[str, Any]]:
    """The launcher's egress check: what to probe, for how long, where to report (the container's
    termination message, which the kubelet copies into the pod's status)."""
    if config.egress_probes is None:
        return []
    probes = [dict(p) for p in config.egress_probes]
    return [
        {"name": "POSTTRAIN_EGRESS_PROBES", "value": json.dumps(probes, separators=(",", ":"))},
        {"name": "POSTTRAIN_EGRESS_BOUND_SECONDS", "value": f"{config.egress_bound_seconds:g}"},
        {"name": "POSTTRAIN_EGRESS_REPORT", "value": TERMINATION_LOG},
        {"name": "POSTTRAIN_NODE_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
    ]


def _resource_env(name: str, resource: str) -> dict[str, Any]:
    """The container's own limit through the Downward API: bytes for memory, whole cores (rounded
    up) for cpu."""
    ref = {"containerName": CONTAINER, "resource": resource, "divisor": "1"}
    return {"name": name, "valueFrom": {"resourceFieldRef": ref}}


def _container(
    config: PodsConfig,
    request: JobRequest,
    resources: dict[str, dict[str, str]],
    mounts: list[dict[str, Any]],
) -> dict[str, Any]:
    return {
        "name": CONTAINER,
        "image": request.image or config.image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["python", "-m", "posttrain_launcher"],
        "env": [
            *({"name": name, "value": value} for name, value in launcher_env(request).items()),
            {"name": "HOME", "value": "/tmp"},  # the root filesystem is read-only
            # The flavor, as HF Jobs states it; the launcher derives its rlimits from it.
            _resource_env("MEMORY", "limits.memory"),
            _resource_env("CPU_CORES", "limits.cpu"),
            # The container's cgroup holds this job alone: its memory limit bounds the job.
            {"name": "POSTTRAIN_MEMORY_CGROUP", "value": "job"},
            *_egress_env(config),
            *_package_env(request),
        ],
        "resources": resources,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": JOB_UID,
            "runAsGroup": JOB_UID,
            "privileged": False,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "seccompProfile": seccomp_profile(config, request),
        },
        "volumeMounts": [
            {"name": SCRATCH_VOLUME, "mountPath": "/tmp"},
            {"name": SHM_VOLUME, "mountPath": "/dev/shm"},
            *mounts,
        ],
    }
