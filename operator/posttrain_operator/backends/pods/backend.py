"""The pods backend's API calls: namespaces, NetworkPolicies and pods through the Kubernetes API, and
the artifact store through the operator's own mount. The only pods module that talks to anything."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from posttrain_operator.api.rules import now_utc
from posttrain_operator.backends.base import (
    TERMINAL_STAGES,
    ArtifactInfo,
    BackendError,
    CallStats,
    Handle,
    JobRequest,
    PackagePin,
    RemoteStatus,
    UnknownFlavor,
    status_label,
)
from posttrain_operator.backends.pods.config import PodsConfig
from posttrain_operator.backends.pods.manifests import (
    is_default_deny,
    namespace_body,
    network_policy_body,
    pod_body,
)
from posttrain_operator.backends.pods.names import (
    CONTAINER,
    EPISODE_ANNOTATION,
    KEY_ANNOTATION,
    KEY_LABEL,
    MANAGED_LABEL,
    NETWORK_POLICY,
    PREFIX_ANNOTATION,
    episode_namespace,
    episode_wheels_subpath,
    label_value,
    wheels_subpath,
)
from posttrain_operator.backends.pods.status import missing_runtime, remote_status, waits_for_sandbox
from posttrain_operator.backends.pods.store import (
    list_artifacts,
    prepare_output_dir,
    read_artifact_file,
    remove_store_tree,
)
from posttrain_operator.backends.wheels import packages_to_stage, stage_job_packages

_TRANSIENT_STATUS = {0, 408, 429, 500, 502, 503, 504}
_PASSING_REFUSALS = (
    re.compile(r"being terminated"),
    re.compile(r'error looking up service account \S+: serviceaccount "[^"]+" not found'),
)


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
    # A namespace being deleted refuses new objects with 403 until it is gone; that passes. So does
    # a new namespace's missing `default` ServiceAccount, which the controller-manager creates a moment
    # later (or once it is back, after a restart): the API server refuses every pod until then.
    transient = exc.status in _TRANSIENT_STATUS or any(
        passing.search(str(detail)) for passing in _PASSING_REFUSALS
    )
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
            result = self._to_dict(await fn())
        except ApiException as exc:
            self.stats.ended(method, status_label(exc))
            if exc.status in passthrough:
                raise
            raise _api_error(method, exc) from exc
        except (aiohttp.ClientError, TimeoutError, OSError) as exc:
            self.stats.ended(method, status_label(exc))
            raise BackendError(f"{method}: {exc!r}", transient=True) from exc
        self.stats.ended(method, "ok")
        return result

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
        packages = packages_to_stage(request, self.config.package_index, "pods.packageIndex")
        namespace = body["metadata"]["namespace"]
        await self._ensure_namespace(namespace, request)
        await self._ensure_network_policy(namespace)
        await self._verify_isolation(namespace)
        prefix = request.outputs.prefix if request.outputs else ""
        if request.outputs is not None and not request.outputs.read_only:
            await asyncio.to_thread(prepare_output_dir, self.config.store_path, prefix)
        pins = await self._stage_packages(namespace, request, packages) if packages else []
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
        return Handle(f"{namespace}/{name}", prefix, packages=tuple(pins))

    async def _stage_packages(
        self, namespace: str, request: JobRequest, packages: list[str]
    ) -> list[PackagePin]:
        self.stats.count("stage_packages")
        try:
            assert self.config.package_index is not None  # packages_to_stage refused the job otherwise
            pins = await asyncio.to_thread(
                stage_job_packages, request, packages, self.config.package_index,
                Path(self.config.store_path, wheels_subpath(namespace, request.key)),
                arch=self.config.package_arch, max_bytes=self.config.max_package_bytes,
                timeout=self.config.request_timeout_seconds,
            )  # fmt: skip
        except BackendError as exc:
            self.stats.ended("stage_packages", "transient" if exc.transient else "refused")
            raise
        self.stats.ended("stage_packages", "ok")
        return pins

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
        known = self._cancelled.entries
        waiting = [p for job_id, p in by_id.items() if job_id not in known and waits_for_sandbox(p)]
        failed = await self._fail_missing_runtimes(waiting) if waiting else set()
        result: dict[str, RemoteStatus] = {}
        for handle in handles:
            job_id = handle.backend_job_id
            if job_id in failed:
                result[job_id] = self._cancelled.entries[job_id]
            elif job_id in by_id:
                result[job_id] = remote_status(by_id[job_id])
            elif job_id in self._cancelled.entries:
                result[job_id] = self._cancelled.entries[job_id]
            else:
                result[job_id] = RemoteStatus("lost", f"pod {job_id} no longer exists", raw_stage="Gone")
        return result

    async def _fail_missing_runtimes(self, waiting: Sequence[dict[str, Any]]) -> set[str]:
        """Pods whose node has no handler for their RuntimeClass: the kubelet retries for ever and
        says why only in events. Each is failed (never started: nothing billed) and deleted."""
        listed = await self._call(
            "list_event_for_all_namespaces",
            lambda: self._core.list_event_for_all_namespaces(
                field_selector="involvedObject.kind=Pod,reason=FailedCreatePodSandBox",
                _request_timeout=self._timeout,
            ),
        )
        said: dict[str, list[str]] = {}
        for event in listed.get("items") or []:
            said.setdefault(event["involvedObject"].get("uid") or "", []).append(event.get("message") or "")
        failed = set()
        for pod in waiting:
            status = missing_runtime(pod, said.get(pod["metadata"].get("uid") or "", []))
            if status is None:
                continue
            job_id = _job_id(pod)
            self._cancelled.put(job_id, status)  # read from here once the pod is gone
            failed.add(job_id)
            with contextlib.suppress(ApiException, BackendError):
                await self._delete_pod(*_split_id(job_id))
        return failed

    async def _delete_pod(self, namespace: str, name: str) -> None:
        await self._call(
            "delete_namespaced_pod",
            lambda: self._core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=self.config.cancel_grace_seconds,
                _request_timeout=self._timeout,
            ),
            passthrough=(404,),
        )  # fmt: skip

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
            await self._delete_pod(namespace, name)
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
        await asyncio.to_thread(remove_store_tree, self.config.store_path, episode_wheels_subpath(name))
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
