"""The gateway's Kubernetes access: Episodes and AgentJobs only (it never reads Secrets). The only
gateway module that calls the API; refusals come out as `Refused`, never as the client's exceptions."""

from __future__ import annotations

import asyncio
import contextlib
import os
from pathlib import Path
from typing import Any

from kubernetes_asyncio import client, config, watch
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator.api.models import GROUP, VERSION
from posttrain_operator.api.tokens import IN_CLUSTER_TOKEN, RereadTokenFile, kubeconfig_token_file

MERGE_PATCH = "application/merge-patch+json"
JSON_PATCH = "application/json-patch+json"
Obj = dict[str, Any]


class Conflict(Exception):
    """A precondition (JSON-patch `test` or resourceVersion) failed: someone wrote first."""


class Refused(Exception):
    """The API server refused a write (400/422: invalid, 409: conflicting); nothing was written."""

    def __init__(self, status: int, detail: str) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail

    @classmethod
    def of(cls, exc: ApiException) -> Refused:
        return cls(exc.status, f"{exc.body!s:.500}")


class WatchExpired(Exception):
    """The watch's resourceVersion is too old (410): read the object afresh and watch again."""


# A 429 means the API server refused the request before acting on it (API Priority and Fairness,
# or a resource's storage still initializing just after its CRD was established), so any request,
# a write too, can be sent again once the server's Retry-After has passed.
TOO_MANY_REQUESTS_ATTEMPTS = 8
MAX_RETRY_AFTER_SECONDS = 5.0


async def make_api_client(kubeconfig: str | None) -> client.ApiClient:
    cfg = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    token_file: str | Path | None
    if path:
        await config.load_kube_config(config_file=path, client_configuration=cfg)
        token_file = kubeconfig_token_file(path)
    else:
        config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]
        token_file = IN_CLUSTER_TOKEN
    if token_file is not None:  # reread as it rotates (kubernetes_asyncio reads a tokenFile once)
        cfg.refresh_api_key_hook = RereadTokenFile(token_file)
    api_client = client.ApiClient(configuration=cfg)
    _retry_too_many_requests(api_client.rest_client)
    return api_client


def _retry_too_many_requests(rest_client: Any) -> None:
    """Every request of this client (each verb goes through `request`) waits out 429s."""
    send = rest_client.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(1, TOO_MANY_REQUESTS_ATTEMPTS + 1):
            try:
                return await send(*args, **kwargs)
            except ApiException as exc:
                if exc.status != 429 or attempt == TOO_MANY_REQUESTS_ATTEMPTS:
                    raise
                await asyncio.sleep(_retry_after(exc))
        raise AssertionError("unreachable")

    rest_client.request = request


def _retry_after(exc: ApiException) -> float:
    headers: Any = exc.headers
    try:
        seconds = float(headers.get("Retry-After", 1)) if headers else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.1), MAX_RETRY_AFTER_SECONDS)


class Kube:
    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)

    async def close(self) -> None:
        await self.api_client.close()

    async def _get(self, namespace: str, plural: str, name: str) -> Obj | None:
        try:
            obj: Obj = await self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return obj

    async def get_episode(self, namespace: str, name: str) -> Obj | None:
        return await self._get(namespace, "episodes", name)

    async def get_agentjob(self, namespace: str, name: str) -> Obj | None:
        return await self._get(namespace, "agentjobs", name)

    async def list_episodes(self, namespace: str) -> list[Obj]:
        found = await self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "episodes")
        items: list[Obj] = found["items"]
        return items

    async def list_agentjobs(self, namespace: str, episode: str) -> list[Obj]:
        # By spec.episode, the truth (a selectable field of the CRD), not by label: the operator
        # labels a job only once it admits it.
        found = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", field_selector=f"spec.episode={episode}"
        )
        items: list[Obj] = found["items"]
        return items

    async def create(self, namespace: str, plural: str, body: Obj) -> Obj:
        """Raises Refused when the schema refuses the object (400/422)."""
        try:
            created: Obj = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body
            )
        except ApiException as exc:
            if exc.status in (400, 422):
                raise Refused.of(exc) from exc
            raise
        return created

    async def _patch_episode(
        self, namespace: str, name: str, body: Any, content_type: str, *, status: bool
    ) -> Obj:
        api = self.custom
        patch = api.patch_namespaced_custom_object_status if status else api.patch_namespaced_custom_object
        patched: Obj = await patch(
            GROUP,
            VERSION,
            namespace,
            "episodes",
            name,
            body,
            _content_type=content_type,  # type: ignore[call-arg]
        )
        return patched

    async def merge_patch_episode(self, namespace: str, name: str, patch: Obj) -> Obj:
        """Raises Refused when a validation rule (e.g. an immutable field) refuses it (409/422)."""
        try:
            patched = await self._patch_episode(namespace, name, patch, MERGE_PATCH, status=False)
        except ApiException as exc:
            if exc.status in (409, 422):
                raise Refused.of(exc) from exc
            raise
        return patched

    async def delete_episode(self, namespace: str, name: str) -> None:
        try:
            await self.custom.delete_namespaced_custom_object(GROUP, VERSION, namespace, "episodes", name)
        except ApiException as exc:
            if exc.status != 404:
                raise

    async def set_steps(self, namespace: str, name: str, current: Obj, steps: int) -> Obj:
        """Write status.steps only if nobody changed it since `current` was read (else Conflict)."""
        status = current.get("status") or {}
        if "steps" in status:
            # A JSON-patch test on the field itself: unrelated status writes (the ledger) don't conflict.
            body: Any = [
                {"op": "test", "path": "/status/steps", "value": status["steps"]},
                {"op": "replace", "path": "/status/steps", "value": steps},
            ]
            content_type = JSON_PATCH
        else:
            body = {
                "metadata": {"resourceVersion": current["metadata"]["resourceVersion"]},
                "status": {"steps": steps},
            }
            content_type = MERGE_PATCH
        try:
            patched = await self._patch_episode(namespace, name, body, content_type, status=True)
        except ApiException as exc:
            # 422: the test op failed; 409: the resourceVersion moved on.
            if exc.status in (409, 422):
                raise Conflict(f"episode {namespace}/{name}: steps changed concurrently") from exc
            raise
        return patched

    async def delete_agentjob(self, namespace: str, name: str) -> bool:
        try:
            await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "agentjobs", name, propagation_policy="Background"
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            raise
        return True

    async def watch_until(
        self, namespace: str, plural: str, name: str, resource_version: str, seconds: float, done: Any
    ) -> Obj | None:
        """Watch one object from `resource_version` until `done(obj)` or the timeout; no polling.
        Returns the last version seen that satisfied `done`, or None on timeout/deletion."""
        w = watch.Watch()
        try:
            async with asyncio.timeout(seconds):
                while True:
                    stream = w.stream(
                        self.custom.list_namespaced_custom_object,
                        GROUP,
                        VERSION,
                        namespace,
                        plural,
                        field_selector=f"metadata.name={name}",
                        resource_version=resource_version,
                        timeout_seconds=max(1, int(seconds) + 1),
                        allow_watch_bookmarks=False,
                    )
                    try:
                        async for event in stream:
                            obj: Obj = event["object"]
                            if event["type"] == "DELETED":
                                return None
                            if event["type"] == "ERROR":
                                raise WatchExpired(str(obj)[:200])
                            resource_version = obj["metadata"]["resourceVersion"]
                            if done(obj):
                                return obj
                    except ApiException as exc:
                        if exc.status != 410:
                            raise
                        # An object unchanged for longer than the server keeps history has a
                        # resourceVersion too old to watch from: restart from the list's, which is now.
                        listed = await self.custom.list_namespaced_custom_object(
                            GROUP, VERSION, namespace, plural, field_selector=f"metadata.name={name}"
                        )
                        if not listed["items"]:
                            return None
                        if done(listed["items"][0]):
                            return dict(listed["items"][0])
                        resource_version = listed["metadata"]["resourceVersion"]
        except TimeoutError:
            return None
        finally:
            w.stop()
            with contextlib.suppress(Exception):
                await w.close()
