"""The `pods` backend: every job is a hardened Pod on the operator's own cluster.

Isolation: one namespace per episode, holding a default-deny (ingress and egress) NetworkPolicy that
is created, and verified to be the only policy there, before any pod; the namespace enforces Pod
Security `restricted` (or the strictest level the store's volume type allows), so the API server
itself refuses a pod that lost its hardening.

Storage ("artifact store"): one shared volume laid out as `repos/<kind>/<repo_id>/<revision>` and
`outputs/<prefix>`. A PersistentVolumeClaim cannot serve it: a pod can only mount claims of its own
namespace and every episode has its own, so the store is an inline volume source (NFS, CSI, CephFS,
or hostPath on single-node dev clusters) that every namespace can name. Pods mount only the
sub-paths their `JobRequest` lists: repos and `inputs_from` read-only, their own output prefix
read-write; the store's root is never mounted. The operator mounts the same store at
`store_path`, which is how it prepares a job's output dir (owned by uid 10000, before the pod
exists) and reads artifacts, without a sidecar or a pod exec.

Names are deterministic: the episode namespace from (namespace, episode), the pod from the
idempotency key, so a 409 on create means "adopt the existing pod". Pods cannot carry an owner
reference to the AgentJob (another namespace), so labels and annotations tie them back.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import json
import os
import re
import stat
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from posttrain_operator.api.rules import EPISODE_LABEL, now_utc, parse_time
from posttrain_operator.backends.base import (
    TERMINAL_STAGES,
    ArtifactInfo,
    BackendError,
    CallStats,
    Handle,
    JobRequest,
    RemoteStatus,
    UnknownFlavor,
)

T = TypeVar("T")

MANAGED_LABEL = "posttrain.dev/managed-by"
KEY_LABEL = "posttrain.dev/key"
SOURCE_NAMESPACE_LABEL = "posttrain.dev/source-namespace"
JOB_LABEL = "posttrain.dev/agentjob"
# Label values are capped at 63 characters and hashed beyond; annotations keep the exact text.
KEY_ANNOTATION = "posttrain.dev/key"
EPISODE_ANNOTATION = "posttrain.dev/episode"
PREFIX_ANNOTATION = "posttrain.dev/output-prefix"
NETWORK_POLICY = "posttrain-default-deny"
CONTAINER = "job"
JOB_UID = 10000
SCRATCH_VOLUME, STORE_RO_VOLUME, STORE_RW_VOLUME = "scratch", "store-ro", "store-rw"
REPOS_DIR, OUTPUTS_DIR = "repos", "outputs"
# Volume types that every namespace can name, with the strictest Pod Security level that admits them.
STORE_VOLUME_TYPES: dict[str, str] = {
    "csi": "restricted",
    "nfs": "baseline",
    "cephfs": "baseline",
    "hostPath": "privileged",  # single-node dev clusters only: baseline forbids hostPath
}
_TRANSIENT_STATUS = {0, 408, 429, 500, 502, 503, 504}
_DNS_UNSAFE = re.compile(r"[^a-z0-9-]+")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_OK = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")
_PREFIX_OK = re.compile(r"^[a-z]([a-z0-9-]{0,14}[a-z0-9])?$")


# --- names --------------------------------------------------------------------------------------


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def dns_name(prefix: str, *parts: str) -> str:
    """A DNS label (<= 63) from `parts`: readable head, plus a hash of the exact parts, so that
    ("a-b", "c") and ("a", "b-c") differ and truncation never merges two names."""
    slug = _DNS_UNSAFE.sub("-", "-".join(parts).lower()).strip("-")
    head = f"{prefix}-{slug}"[: 63 - 11].rstrip("-")
    return f"{head}-{_digest(chr(0).join(parts))}"


def label_value(text: str) -> str:
    """`text` if it is a valid label value, else a truncated, hashed stand-in (also valid)."""
    if _LABEL_OK.match(text):
        return text
    head = _LABEL_UNSAFE.sub("-", text)[:52].strip("-_.")
    return f"{head}-{_digest(text)}" if head else _digest(text)


def episode_namespace(prefix: str, namespace: str, episode: str) -> str:
    return dns_name(prefix, namespace, episode)


def pod_name(key: str) -> str:
    return dns_name("job", key)


def _relpath(*parts: str) -> str:
    """A store sub-path; refuses anything that could leave the store (the API server refuses '..'
    in subPath too, but the operator also uses these paths on its own mount)."""
    segments = [s for p in parts for s in p.split("/")]
    if any(s in ("", ".", "..") or "\\" in s or "\0" in s for s in segments):
        raise BackendError(f"unsafe store path {'/'.join(parts)!r}", transient=False)
    return "/".join(segments)


def repo_subpath(kind: str, repo_id: str, revision: str) -> str:
    return _relpath(REPOS_DIR, kind, repo_id, revision)


def output_subpath(prefix: str) -> str:
    return _relpath(OUTPUTS_DIR, prefix)


# --- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Flavor:
    cpu: str
    memory: str
    price_micro_usd_per_minute: int


@dataclass(frozen=True)
class PodsConfig:
    image: str
    flavors: Mapping[str, Flavor]
    store_volume: Mapping[str, Any]  # one Kubernetes volume source, e.g. {"nfs": {...}}
    store_path: str  # where this process sees the same store
    instance: str = "posttrain-operator"
    namespace_prefix: str = "pt"
    scratch_size: str = "10Gi"
    cancel_grace_seconds: int = 2
    confirm_timeout_seconds: float = 10.0
    request_timeout_seconds: float = 30.0
    max_log_bytes: int = 1 << 20
    max_artifacts_listed: int = 10_000

    def __post_init__(self) -> None:
        if len(self.store_volume) != 1:
            raise ValueError("the store volume must be exactly one volume source, e.g. {'nfs': {...}}")
        ((kind, source),) = self.store_volume.items()
        if kind not in STORE_VOLUME_TYPES or not isinstance(source, Mapping):
            raise ValueError(
                f"store volume type {kind!r} cannot be mounted from every episode namespace; use one of "
                f"{', '.join(sorted(STORE_VOLUME_TYPES))} (a persistentVolumeClaim is per namespace)"
            )
        if not _PREFIX_OK.match(self.namespace_prefix):
            raise ValueError(f"namespace prefix {self.namespace_prefix!r}: a DNS label of <= 16 characters")
        if not 0 <= self.cancel_grace_seconds <= 5:
            raise ValueError("cancel_grace_seconds must be within 0..5")

    @property
    def store_kind(self) -> str:
        return next(iter(self.store_volume))

    @property
    def pod_security_level(self) -> str:
        return STORE_VOLUME_TYPES[self.store_kind]


# --- pure builders ------------------------------------------------------------------------------


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


def pod_labels(config: PodsConfig, request: JobRequest) -> dict[str, str]:
    return {
        MANAGED_LABEL: label_value(config.instance),
        KEY_LABEL: label_value(request.key),
        SOURCE_NAMESPACE_LABEL: label_value(request.namespace),
        EPISODE_LABEL: label_value(request.episode),
        JOB_LABEL: label_value(request.job_name),
    }


def pod_body(config: PodsConfig, request: JobRequest) -> dict[str, Any]:
    flavor = config.flavors.get(request.flavor)
    if flavor is None:
        raise UnknownFlavor(request.flavor, list(config.flavors))
    mounts = store_mounts(request)
    used = {m["name"] for m in mounts}
    volumes: list[dict[str, Any]] = [{"name": SCRATCH_VOLUME, "emptyDir": {"sizeLimit": config.scratch_size}}]
    if STORE_RO_VOLUME in used:
        volumes.append({"name": STORE_RO_VOLUME, **_read_only_source(config.store_volume)})
    if STORE_RW_VOLUME in used:
        volumes.append({"name": STORE_RW_VOLUME, **dict(config.store_volume)})
    resources = {"cpu": flavor.cpu, "memory": flavor.memory, "ephemeral-storage": config.scratch_size}
    seccomp = {"type": "RuntimeDefault"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(request.key),
            "namespace": episode_namespace(config.namespace_prefix, request.namespace, request.episode),
            "labels": pod_labels(config, request),
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
                "seccompProfile": seccomp,
            },
            "containers": [
                {
                    "name": CONTAINER,
                    "image": config.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": ["python", "-m", "posttrain_launcher"],
                    # The agent's own script and packages, never a credential.
                    "env": [
                        {
                            "name": "POSTTRAIN_JOB_SPEC",
                            "value": json.dumps(request.launcher_spec, separators=(",", ":")),
                        },
                        {"name": "HOME", "value": "/tmp"},  # the root filesystem is read-only
                    ],
                    "resources": {"requests": resources, "limits": dict(resources)},
                    "securityContext": {
                        "runAsNonRoot": True,
                        "runAsUser": JOB_UID,
                        "runAsGroup": JOB_UID,
                        "privileged": False,
                        "allowPrivilegeEscalation": False,
                        "capabilities": {"drop": ["ALL"]},
                        "readOnlyRootFilesystem": True,
                        "seccompProfile": seccomp,
                    },
                    "volumeMounts": [{"name": SCRATCH_VOLUME, "mountPath": "/tmp"}, *mounts],
                }
            ],
            "volumes": volumes,
        },
    }


def remote_status(pod: Mapping[str, Any]) -> RemoteStatus:
    """Pod phase and the job container's state -> RemoteStatus. Billing starts when the container
    runs, not when the pod is created (a pod may wait for a node or an image for a long time)."""
    status = pod.get("status") or {}
    phase = status.get("phase") or "Pending"
    container: dict[str, Any] = next(
        (c for c in status.get("containerStatuses") or [] if c.get("name") == CONTAINER), {}
    )
    state = container.get("state") or {}
    running, terminated, waiting = state.get("running"), state.get("terminated"), state.get("waiting")
    started = parse_time((running or terminated or {}).get("startedAt"))
    finished = parse_time((terminated or {}).get("finishedAt"))
    if phase == "Pending":
        reason, message = "", ""
        if waiting:
            reason, message = waiting.get("reason") or "", waiting.get("message") or ""
        else:
            for condition in status.get("conditions") or []:
                if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
                    reason, message = condition.get("reason") or "", condition.get("message") or ""
        text = f"{reason}: {message}" if reason and message else reason or message
        return RemoteStatus("pending", text, raw_stage=f"Pending/{reason}" if reason else "Pending")
    if phase == "Running":
        return RemoteStatus("running", "", started, None, "Running")
    if phase in ("Succeeded", "Failed"):
        if finished is None and started is not None:
            # e.g. DeadlineExceeded before the kubelet recorded the container's end
            times = [parse_time(c.get("lastTransitionTime")) for c in status.get("conditions") or []]
            finished = max((t for t in times if t is not None), default=None)
        if phase == "Succeeded":
            return RemoteStatus("succeeded", "", started, finished, "Succeeded")
        parts = []
        if status.get("reason"):
            parts.append(f"{status['reason']}: {status.get('message') or ''}".rstrip(": "))
        if terminated:
            why = terminated.get("reason") or "Error"
            parts.append(f"container exited with code {terminated.get('exitCode')} ({why})")
        raw = status.get("reason") or (terminated or {}).get("reason") or ""
        return RemoteStatus(
            "failed",
            "; ".join(parts) or "pod failed",
            started,
            finished,
            f"Failed/{raw}" if raw else "Failed",
        )
    # "Unknown": the node stopped reporting. The pod may still be running (and billing).
    return RemoteStatus("running", "the pod's node is not reporting", started, None, phase)


# --- the operator's view of the store -----------------------------------------------------------


def prepare_output_dir(store_path: str, prefix: str) -> None:
    """Create the job's output dir on the store, writable by uid 10000 and nobody else. The kubelet
    would otherwise create a missing subPath as root, and the launcher would refuse it."""
    target = Path(store_path, output_subpath(prefix))
    target.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    try:
        target.mkdir(mode=0o700)
    except FileExistsError:
        return  # an earlier attempt made it; the job may already have written to it
    euid = os.geteuid()
    if euid == 0:
        os.chown(target, JOB_UID, JOB_UID)
    elif euid != JOB_UID:
        target.rmdir()
        raise BackendError(
            f"the operator runs as uid {euid}: it must run as root or uid {JOB_UID} to give jobs "
            "their output dirs on the artifact store",
            transient=False,
        )


def list_artifacts(store_path: str, prefix: str, limit: int) -> list[ArtifactInfo]:
    """Regular files under the job's output dir; symlinks and special files are never followed."""
    root = Path(store_path, output_subpath(prefix))
    found: list[ArtifactInfo] = []
    for directory, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(directory, name)
            try:
                info = path.lstat()
            except FileNotFoundError:
                continue  # removed while we walked
            if stat.S_ISREG(info.st_mode):
                found.append(ArtifactInfo(path.relative_to(root).as_posix(), info.st_size))
            if len(found) >= limit:
                return found
    return found


def read_artifact_file(store_path: str, prefix: str, path: str, max_bytes: int) -> bytes:
    """Read a file a job wrote. The job is untrusted and may plant symlinks, FIFOs or swap
    directories while we read, so every component is opened relative to its parent with
    O_NOFOLLOW, and only a regular file is read."""
    parts = _relpath(path).split("/")
    flags_dir = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
    try:
        fd = os.open(Path(store_path, output_subpath(prefix)), flags_dir)
    except FileNotFoundError:
        raise FileNotFoundError(path) from None
    try:
        for part in parts[:-1]:
            next_fd = os.open(part, flags_dir, dir_fd=fd)
            os.close(fd)
            fd = next_fd
        file_fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except FileNotFoundError:
        raise FileNotFoundError(path) from None
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise BackendError(
                f"artifact {path!r} is not a regular file (symlink?)", transient=False
            ) from exc
        raise
    finally:
        os.close(fd)
    with os.fdopen(file_fd, "rb") as handle:
        if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
            raise BackendError(f"artifact {path!r} is not a regular file", transient=False)
        data = handle.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise BackendError(f"artifact {path} is larger than {max_bytes} bytes", transient=False)
    return data


# --- the backend --------------------------------------------------------------------------------


def _wire(body: dict[str, Any]) -> Any:
    """The client serializes plain dicts as they are; its annotations only name the model classes."""
    return body


def _job_id(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def _annotations(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def _split_id(backend_job_id: str) -> tuple[str, str]:
    namespace, _, name = backend_job_id.partition("/")
    if not namespace or not name:
        raise BackendError(f"not a pods job id (namespace/pod): {backend_job_id!r}", transient=False)
    return namespace, name


def _api_error(method: str, exc: ApiException) -> BackendError:
    detail = exc.reason or ""
    with contextlib.suppress(TypeError, ValueError, AttributeError):
        detail = json.loads(exc.body or "{}").get("message") or detail
    # A namespace being deleted refuses new objects with 403 until it is gone; that passes.
    transient = exc.status in _TRANSIENT_STATUS or "being terminated" in str(detail)
    return BackendError(f"{method}: HTTP {exc.status}: {detail}"[:1000], transient=transient)


@dataclass
class _Memo:
    """Final statuses of pods this process deleted: a deleted pod is gone from the API, and
    without this a cancelled job would read as "lost" (and its running time as unbilled)."""

    entries: OrderedDict[str, RemoteStatus] = field(default_factory=OrderedDict)
    limit: int = 10_000

    def put(self, job_id: str, status: RemoteStatus) -> None:
        self.entries[job_id] = status
        while len(self.entries) > self.limit:
            self.entries.popitem(last=False)


class PodsBackend:
    name = "pods"

    def __init__(
        self,
        config: PodsConfig,
        api_client: client.ApiClient,
        *,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self.config = config
        self.stats = CallStats()
        self.clock = clock
        self._core = client.CoreV1Api(api_client)
        self._net = client.NetworkingV1Api(api_client)
        self._to_dict: Callable[[Any], Any] = api_client.sanitize_for_serialization
        self._cancelled = _Memo()

    async def _call(
        self, method: str, fn: Callable[[], Awaitable[Any]], *, passthrough: tuple[int, ...] = ()
    ) -> Any:
        """One API call: counted, bounded in time, errors mapped to BackendError except the HTTP
        statuses the caller handles itself (404, 409), which raise ApiException."""
        self.stats.count(method)
        try:
            return self._to_dict(await fn())
        except ApiException as exc:
            if exc.status in passthrough:
                raise
            raise _api_error(method, exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            raise BackendError(f"{method}: {exc!r}", transient=True) from exc

    @property
    def _timeout(self) -> float:
        return self.config.request_timeout_seconds

    async def price(self, flavor: str) -> int:
        if flavor not in self.config.flavors:
            raise UnknownFlavor(flavor, list(self.config.flavors))
        return self.config.flavors[flavor].price_micro_usd_per_minute

    # submit ---------------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> Handle:
        body = pod_body(self.config, request)  # UnknownFlavor and unsafe paths fail before any call
        namespace = body["metadata"]["namespace"]
        await self._ensure_namespace(namespace, request)
        await self._ensure_network_policy(namespace)
        await self._verify_isolation(namespace)
        prefix = request.outputs.prefix if request.outputs else ""
        if request.outputs is not None and not request.outputs.read_only:
            await asyncio.to_thread(prepare_output_dir, self.config.store_path, prefix)
        name = body["metadata"]["name"]
        try:
            await self._call(
                "create_namespaced_pod",
                lambda: self._core.create_namespaced_pod(
                    namespace, _wire(body), _request_timeout=self._timeout
                ),
                passthrough=(409,),
            )
        except ApiException:
            # Deterministic name: a 409 is our own earlier attempt (or a racing one). Adopt it.
            existing = await self._get_pod(namespace, name)
            if existing is None:
                raise BackendError(
                    f"pod {namespace}/{name} conflicted, then vanished", transient=True
                ) from None
            found_key = _annotations(existing).get(KEY_ANNOTATION)
            if found_key != request.key:
                raise BackendError(
                    f"pod {namespace}/{name} exists for another key ({found_key!r})", transient=False
                ) from None
        return Handle(f"{namespace}/{name}", prefix)

    async def _ensure_namespace(self, name: str, request: JobRequest) -> None:
        body = namespace_body(self.config, name, request.namespace, request.episode)
        try:
            await self._call(
                "create_namespace",
                lambda: self._core.create_namespace(_wire(body), _request_timeout=self._timeout),
                passthrough=(409,),
            )
            return
        except ApiException:
            pass
        existing = await self._call(
            "read_namespace", lambda: self._core.read_namespace(name, _request_timeout=self._timeout)
        )
        meta = existing["metadata"]
        ours = (meta.get("labels") or {}).get(MANAGED_LABEL) == label_value(self.config.instance) and (
            meta.get("annotations") or {}
        ).get(EPISODE_ANNOTATION) == f"{request.namespace}/{request.episode}"
        if not ours:
            raise BackendError(
                f"namespace {name} exists but is not this operator's namespace for episode "
                f"{request.namespace}/{request.episode}; refusing to run jobs in it",
                transient=False,
            )
        if (existing.get("status") or {}).get("phase") == "Terminating":
            raise BackendError(f"namespace {name} is being deleted; retry once it is gone", transient=True)

    async def _ensure_network_policy(self, namespace: str) -> None:
        body = network_policy_body(self.config, namespace)
        with contextlib.suppress(ApiException):  # 409 exists: _verify_isolation checks what it says
            await self._call(
                "create_namespaced_network_policy",
                lambda: self._net.create_namespaced_network_policy(
                    namespace, _wire(body), _request_timeout=self._timeout
                ),
                passthrough=(409,),
            )

    async def _verify_isolation(self, namespace: str) -> None:
        """Read back, right before a pod is created, that the namespace's only NetworkPolicy is our
        default deny. Policies are additive: any other one could allow traffic."""
        listed = await self._call(
            "list_namespaced_network_policy",
            lambda: self._net.list_namespaced_network_policy(namespace, _request_timeout=self._timeout),
        )
        policies = listed.get("items") or []
        ours = [p for p in policies if p["metadata"]["name"] == NETWORK_POLICY and is_default_deny(p)]
        others = [p["metadata"]["name"] for p in policies if p["metadata"]["name"] != NETWORK_POLICY]
        if not ours or others:
            raise BackendError(
                f"namespace {namespace} is not isolated: want only the default-deny NetworkPolicy "
                f"{NETWORK_POLICY}, found {sorted(p['metadata']['name'] for p in policies)}; "
                "refusing to create a pod",
                transient=False,
            )

    # find / status ------------------------------------------------------------------------------

    async def _get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = await self._call(
                "read_namespaced_pod",
                lambda: self._core.read_namespaced_pod(name, namespace, _request_timeout=self._timeout),
                passthrough=(404,),
            )
        except ApiException:
            return None
        return pod

    def _managed_selector(self) -> str:
        return f"{MANAGED_LABEL}={label_value(self.config.instance)}"

    async def find(self, key: str) -> Handle | None:
        # The key alone does not name the episode's namespace, so this is one list by label
        # (served from the API server's index) rather than a GET.
        listed = await self._call(
            "list_pod_for_all_namespaces",
            lambda: self._core.list_pod_for_all_namespaces(
                label_selector=f"{self._managed_selector()},{KEY_LABEL}={label_value(key)}",
                _request_timeout=self._timeout,
            ),
        )
        # The label may be a hashed stand-in; the annotation holds the exact key.
        pods = [p for p in listed.get("items") or [] if _annotations(p).get(KEY_ANNOTATION) == key]
        if not pods:
            return None
        # Two pods with one key would be a bug upstream of us; the oldest is the one we track.
        pod = min(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        return Handle(_job_id(pod), _annotations(pod).get(PREFIX_ANNOTATION, ""))

    async def status_many(self, handles: Sequence[Handle]) -> dict[str, RemoteStatus]:
        """One list call across namespaces, by the managed-by label: the cost does not grow with the
        number of handles or episodes (a per-namespace list would)."""
        if not handles:
            return {}
        listed = await self._call(
            "list_pod_for_all_namespaces",
            lambda: self._core.list_pod_for_all_namespaces(
                label_selector=self._managed_selector(), _request_timeout=self._timeout
            ),
        )
        by_id = {_job_id(p): p for p in listed.get("items") or []}
        result: dict[str, RemoteStatus] = {}
        for handle in handles:
            job_id = handle.backend_job_id
            if job_id in by_id:
                result[job_id] = remote_status(by_id[job_id])
            elif job_id in self._cancelled.entries:
                result[job_id] = self._cancelled.entries[job_id]
            else:
                result[job_id] = RemoteStatus("lost", f"pod {job_id} no longer exists", raw_stage="Gone")
        return result

    # cancel -----------------------------------------------------------------------------------

    async def cancel(self, handle: Handle) -> bool:
        namespace, name = _split_id(handle.backend_job_id)
        pod = await self._get_pod(namespace, name)
        if pod is None:
            return True
        before = remote_status(pod)
        if before.stage in TERMINAL_STAGES:
            return True  # finished on its own: keep it (and its logs) until the namespace goes
        self._cancelled.put(
            handle.backend_job_id,
            RemoteStatus(
                "cancelled",
                "deleted by the operator",
                before.started_at,
                self.clock() if before.started_at else None,
                "Deleted",
            ),
        )
        try:
            await self._call(
                "delete_namespaced_pod",
                lambda: self._core.delete_namespaced_pod(
                    name,
                    namespace,
                    grace_period_seconds=self.config.cancel_grace_seconds,
                    _request_timeout=self._timeout,
                ),
                passthrough=(404,),
            )
        except ApiException:
            return True
        return await self._confirm_gone(namespace, name)

    async def _confirm_gone(self, namespace: str, name: str) -> bool:
        """A 200 on delete is not a confirmation; only a 404 or a terminal phase is. The kubelet
        needs up to the grace period; an unscheduled pod goes at once."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.cancel_grace_seconds + self.config.confirm_timeout_seconds
        delay = 0.1
        while True:
            pod = await self._get_pod(namespace, name)
            if pod is None or remote_status(pod).stage in TERMINAL_STAGES:
                return True
            if loop.time() + delay > deadline:
                return False
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    # logs and artifacts -----------------------------------------------------------------------

    async def logs(self, handle: Handle, tail: int) -> list[str]:
        if tail <= 0:
            return []
        namespace, name = _split_id(handle.backend_job_id)
        try:
            text = await self._call(
                "read_namespaced_pod_log",
                lambda: self._core.read_namespaced_pod_log(
                    name,
                    namespace,
                    container=CONTAINER,
                    tail_lines=tail,
                    limit_bytes=self.config.max_log_bytes,
                    _request_timeout=self._timeout,
                ),
                # 404: the pod is gone; 400: its container has not started (no logs yet).
                passthrough=(400, 404),
            )
        except ApiException:
            return []
        lines: list[str] = str(text or "").splitlines()
        return lines[-tail:]

    async def artifacts(self, output_prefix: str) -> list[ArtifactInfo]:
        try:
            return await asyncio.to_thread(
                list_artifacts, self.config.store_path, output_prefix, self.config.max_artifacts_listed
            )
        except OSError as exc:
            raise BackendError(
                f"listing {output_prefix} on the artifact store: {exc}", transient=True
            ) from exc

    async def read_artifact(self, output_prefix: str, path: str, max_bytes: int) -> bytes:
        try:
            return await asyncio.to_thread(
                read_artifact_file, self.config.store_path, output_prefix, path, max_bytes
            )
        except (FileNotFoundError, BackendError):
            raise
        except OSError as exc:
            raise BackendError(f"reading {path} on the artifact store: {exc}", transient=True) from exc

    # episode clean-up (not in the Backend protocol yet) ---------------------------------------

    async def release_episode(self, namespace: str, episode: str) -> bool:
        """Delete the episode's namespace (its pods, finished ones included, and its policy).
        True once the API server reports it gone. Call only after every job is confirmed cancelled."""
        name = episode_namespace(self.config.namespace_prefix, namespace, episode)
        try:
            await self._call(
                "delete_namespace",
                lambda: self._core.delete_namespace(name, _request_timeout=self._timeout),
                passthrough=(404,),
            )
        except ApiException:
            return True
        try:
            await self._call(
                "read_namespace",
                lambda: self._core.read_namespace(name, _request_timeout=self._timeout),
                passthrough=(404,),
            )
        except ApiException:
            return True
        return False
