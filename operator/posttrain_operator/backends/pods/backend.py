"""The pods backend: pods through the Kubernetes API (`kube_calls`), each in its episode's isolated
namespace (`namespaces`), and the artifact store through the operator's own mount. With those two, the
only pods modules that talk to anything."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

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
)
from posttrain_operator.backends.pods.config import PodsConfig
from posttrain_operator.backends.pods.kube_calls import KubeCalls, annotations_of, job_id_of, split_id, wire
from posttrain_operator.backends.pods.manifests import (
    pod_body,
)
from posttrain_operator.backends.pods.names import (
    CONTAINER,
    KEY_ANNOTATION,
    KEY_LABEL,
    MANAGED_LABEL,
    PREFIX_ANNOTATION,
    episode_namespace,
    episode_wheels_subpath,
    label_value,
    wheels_subpath,
)
from posttrain_operator.backends.pods.namespaces import delete_namespace, prepare_namespace
from posttrain_operator.backends.pods.status import missing_runtime, remote_status, waits_for_sandbox
from posttrain_operator.backends.pods.store import (
    list_artifacts,
    prepare_output_dir,
    read_artifact_file,
    remove_store_tree,
)
from posttrain_operator.backends.wheels import packages_to_stage, stage_job_packages


@dataclass
class _Memo:
    """Statuses this process decided or read, by job id, for when the pod is no longer listed."""

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
        self._calls = KubeCalls(config, api_client, self.stats)
        # Final statuses of deleted pods, read before their finalizer went (or, for a pod created
        # without it by an earlier version, the cancel's read before its delete): a job whose pod is
        # gone reads from here rather than as "lost".
        self._final = _Memo()
        # Jobs failed for a missing runtime handler: their pod, deleted, would read as cancelled.
        self._failed = _Memo()

    async def price(self, flavor: str) -> int:
        if flavor not in self.config.flavors:
            raise UnknownFlavor(flavor, list(self.config.flavors))
        return self.config.flavors[flavor].price_micro_usd_per_minute

    # submit ---------------------------------------------------------------------------------

    async def submit(self, request: JobRequest) -> Handle:
        body = pod_body(self.config, request)  # UnknownFlavor and unsafe paths fail before any call
        packages = packages_to_stage(request, self.config.package_index, "pods.packageIndex")
        namespace = body["metadata"]["namespace"]
        await prepare_namespace(self._calls, namespace, request)
        prefix = request.outputs.prefix if request.outputs else ""
        if request.outputs is not None and not request.outputs.read_only:
            await asyncio.to_thread(prepare_output_dir, self.config.store_path, prefix)
        pins = await self._stage_packages(namespace, request, packages) if packages else []
        name = body["metadata"]["name"]
        try:
            await self._calls.call(
                "create_namespaced_pod",
                lambda: self._calls.core.create_namespaced_pod(
                    namespace, wire(body), _request_timeout=self._calls.timeout
                ),
                passthrough=(409,),
            )
        except ApiException:
            # Deterministic name: a 409 is our own earlier attempt (or a racing one). Adopt it.
            existing = await self._calls.get_pod(namespace, name)
            if existing is None:
                raise BackendError(
                    f"pod {namespace}/{name} conflicted, then vanished", transient=True
                ) from None
            found_key = annotations_of(existing).get(KEY_ANNOTATION)
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

    # find / status ------------------------------------------------------------------------------

    def _managed_selector(self) -> str:
        return f"{MANAGED_LABEL}={label_value(self.config.instance)}"

    async def find(self, key: str) -> Handle | None:
        # The key alone does not name the episode's namespace, so this is one list by label
        # (served from the API server's index) rather than a GET.
        listed = await self._calls.call(
            "list_pod_for_all_namespaces",
            lambda: self._calls.core.list_pod_for_all_namespaces(
                label_selector=f"{self._managed_selector()},{KEY_LABEL}={label_value(key)}",
                _request_timeout=self._calls.timeout,
            ),
        )
        # The label may be a hashed stand-in; the annotation holds the exact key.
        pods = [p for p in listed.get("items") or [] if annotations_of(p).get(KEY_ANNOTATION) == key]
        if not pods:
            return None
        # Two pods with one key would be a bug upstream of us; the oldest is the one we track.
        pod = min(pods, key=lambda p: str(p["metadata"].get("creationTimestamp") or ""))
        return Handle(job_id_of(pod), annotations_of(pod).get(PREFIX_ANNOTATION, ""))

    async def status_many(self, handles: Sequence[Handle]) -> dict[str, RemoteStatus]:
        """One list call across namespaces, by the managed-by label: the cost does not grow with the
        number of handles or episodes (a per-namespace list would)."""
        if not handles:
            return {}
        listed = await self._calls.call(
            "list_pod_for_all_namespaces",
            lambda: self._calls.core.list_pod_for_all_namespaces(
                label_selector=self._managed_selector(), _request_timeout=self._calls.timeout
            ),
        )
        by_id = {job_id_of(p): p for p in listed.get("items") or []}
        known = self._failed.entries
        waiting = [p for job_id, p in by_id.items() if job_id not in known and waits_for_sandbox(p)]
        if waiting:
            await self._fail_missing_runtimes(waiting)
        result: dict[str, RemoteStatus] = {}
        for handle in handles:
            job_id = handle.backend_job_id
            if job_id in self._failed.entries:
                result[job_id] = self._failed.entries[job_id]
            elif job_id in by_id:
                result[job_id] = self._read(job_id, by_id[job_id])
            elif job_id in self._final.entries:
                result[job_id] = self._final.entries[job_id]
            else:
                result[job_id] = RemoteStatus("lost", f"pod {job_id} no longer exists", raw_stage="Gone")
        return result

    def _read(self, job_id: str, pod: dict[str, Any]) -> RemoteStatus:
        status = remote_status(pod)
        if pod["metadata"].get("deletionTimestamp") and status.stage in TERMINAL_STAGES:
            self._final.put(job_id, status)  # should its finalizer go before the job is settled
        return status

    async def _fail_missing_runtimes(self, waiting: Sequence[dict[str, Any]]) -> None:
        """Pods whose node has no handler for their RuntimeClass: the kubelet retries for ever and
        says why only in events. Each is failed (never started: nothing billed), deleted and released."""
        listed = await self._calls.call(
            "list_event_for_all_namespaces",
            lambda: self._calls.core.list_event_for_all_namespaces(
                field_selector="involvedObject.kind=Pod,reason=FailedCreatePodSandBox",
                _request_timeout=self._calls.timeout,
            ),
        )
        said: dict[str, list[str]] = {}
        for event in listed.get("items") or []:
            said.setdefault(event["involvedObject"].get("uid") or "", []).append(event.get("message") or "")
        for pod in waiting:
            status = missing_runtime(pod, said.get(pod["metadata"].get("uid") or "", []))
            if status is None:
                continue
            job_id = job_id_of(pod)
            self._failed.put(job_id, status)
            with contextlib.suppress(ApiException, BackendError):
                await self._calls.delete_pod(*split_id(job_id))
                # Its status comes from the events, not the pod, and it never ran: nothing to wait
                # for (after a restart of ours before the job is settled, it reads as lost: unbilled).
                await self._calls.release_pod(pod)

    # cancel -----------------------------------------------------------------------------------

    async def cancel(self, handle: Handle) -> bool:
        """Delete the pod; confirmed once its final status is read. The backend's finalizer holds the
        deleted pod until then (and until its episode's namespace goes), so the run times its kubelet
        reports as it kills the container are what the job is billed, even after a restart of ours."""
        namespace, name = split_id(handle.backend_job_id)
        pod = await self._calls.get_pod(namespace, name)
        if pod is None:
            return True
        before = remote_status(pod)
        if before.stage in TERMINAL_STAGES:
            # Finished on its own (kept, with its logs, until the namespace goes), or deleted and ended.
            return True
        if not pod["metadata"].get("deletionTimestamp"):
            # Only for a pod that goes before its final status is read (created by a version without
            # the finalizer, or its finalizer removed by hand): the run up to the delete, as this read
            # saw it. The final status, once read, replaces it.
            started = before.started_at
            ended = self.clock() if started else None
            fallback = RemoteStatus("cancelled", "deleted by the operator", started, ended, "Deleted")
            self._final.put(handle.backend_job_id, fallback)
            try:
                await self._calls.delete_pod(namespace, name)
            except ApiException:
                return True
        return await self._confirm_ended(namespace, name)

    async def _confirm_ended(self, namespace: str, name: str) -> bool:
        """A 200 on delete is not a confirmation; only a 404 or a terminal status is (for a deleted
        pod: its kubelet reported the container's end, or it was never on a node). The kubelet needs
        up to the grace period; an unscheduled pod is final at once. A node that never reports leaves
        the cancel unconfirmed (the job Orphaned, retried), never settled at nothing."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.cancel_grace_seconds + self.config.confirm_timeout_seconds
        delay = 0.1
        while True:
            pod = await self._calls.get_pod(namespace, name)
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
        namespace, name = split_id(handle.backend_job_id)
        try:
            text = await self._calls.call(
                "read_namespaced_pod_log",
                lambda: self._calls.core.read_namespaced_pod_log(
                    name,
                    namespace,
                    container=CONTAINER,
                    tail_lines=tail,
                    limit_bytes=self.config.max_log_bytes,
                    _request_timeout=self._calls.timeout,
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
        # Every job is settled: their pods' final statuses are read, and the finalizer that holds
        # them would hold the namespace's deletion for ever. Again on every retry.
        await self._calls.release_namespace_pods(name)
        return await delete_namespace(self._calls, name)
