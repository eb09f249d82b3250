"""The pods backend's Kubernetes API calls, each counted, bounded in time and with its errors mapped
to BackendError; and the pod reads and deletes that several of its steps share."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from posttrain_operator.backends.base import BackendError, CallStats, status_label
from posttrain_operator.backends.pods.config import PodsConfig
from posttrain_operator.backends.pods.names import POD_FINALIZER

_TRANSIENT_STATUS = {0, 408, 429, 500, 502, 503, 504}
_PASSING_REFUSALS = (
    re.compile(r"being terminated"),
    re.compile(r'error looking up service account \S+: serviceaccount "[^"]+" not found'),
)


def wire(body: dict[str, Any]) -> Any:
    """The client serializes plain dicts as they are; its annotations only name the model classes."""
    return body


def job_id_of(pod: Mapping[str, Any]) -> str:
    return f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"


def annotations_of(obj: Mapping[str, Any]) -> dict[str, str]:
    return dict(obj["metadata"].get("annotations") or {})


def split_id(backend_job_id: str) -> tuple[str, str]:
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


class KubeCalls:
    def __init__(self, config: PodsConfig, api_client: client.ApiClient, stats: CallStats) -> None:
        self.config = config
        self.stats = stats
        self.core = client.CoreV1Api(api_client)
        self.net = client.NetworkingV1Api(api_client)
        self._to_dict: Callable[[Any], Any] = api_client.sanitize_for_serialization

    @property
    def timeout(self) -> float:
        return self.config.request_timeout_seconds

    async def call(
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

    async def get_pod(self, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            pod: dict[str, Any] = await self.call(
                "read_namespaced_pod",
                lambda: self.core.read_namespaced_pod(name, namespace, _request_timeout=self.timeout),
                passthrough=(404,),
            )
        except ApiException:
            return None
        return pod

    async def delete_pod(self, namespace: str, name: str) -> None:
        await self.call(
            "delete_namespaced_pod",
            lambda: self.core.delete_namespaced_pod(
                name, namespace, grace_period_seconds=self.config.cancel_grace_seconds,
                _request_timeout=self.timeout,
            ),
            passthrough=(404,),
        )  # fmt: skip

    async def release_pod(self, pod: Mapping[str, Any]) -> None:
        """Take the backend's finalizer off `pod`, once nothing needs its final status any more. A
        strategic merge patch that deletes that one entry (ObjectMeta's finalizers merge as a set): a
        finalizer another controller adds or removes meanwhile (Kueue's) is neither lost nor a
        conflict. A pod already gone is released."""
        meta = pod["metadata"]
        if POD_FINALIZER not in (meta.get("finalizers") or []):
            return
        patch = {"metadata": {"$deleteFromPrimitiveList/finalizers": [POD_FINALIZER]}}
        with contextlib.suppress(ApiException):
            await self.call(
                "patch_namespaced_pod",
                lambda: self.core.patch_namespaced_pod(
                    meta["name"], meta["namespace"], patch, _request_timeout=self.timeout
                ),
                passthrough=(404,),
            )

    async def release_namespace_pods(self, namespace: str) -> None:
        """Release every pod of an episode's namespace, so that its deletion is not held by them.
        Only once each of their jobs is settled: their final statuses are read then."""
        try:
            listed = await self.call(
                "list_namespaced_pod",
                lambda: self.core.list_namespaced_pod(namespace, _request_timeout=self.timeout),
                passthrough=(404,),
            )
        except ApiException:
            return
        for pod in listed.get("items") or []:
            await self.release_pod(pod)
