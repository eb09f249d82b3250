"""The gateway's Kubernetes access: Episodes and AgentJobs only (it never reads Secrets). With
`kube_mirror`, the only gateway module that calls the API; refusals come out as `Refused`, never as
the client's exceptions.

Reads are served from watch-fed copies of the namespace's Episodes and AgentJobs (`cache.Store`, one
`kube_mirror.Mirror` per resource, started with the app), so a tool call waits on no API round trip but
its step write. Every object the gateway reads or writes through the API goes into the copy as well, and
the copy takes only newer versions: what one caller was shown is never followed by something older (within
one process; the chart runs one replica)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator import client_environment
from posttrain_operator.api.models import GROUP, VERSION

from env_gateway.cache import Store, wait_any, wait_until
from env_gateway.kube_mirror import Mirror

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


class Unavailable(Exception):
    """The API server could not be asked, or answered about itself rather than the request: it is
    restarting or away (no connection, 5xx), overloaded past our patience (429), or cannot yet
    authenticate or authorize the gateway's own identity (401/403 while a starting server loads its
    RBAC). Nothing the caller did: the same call may succeed after `retry_after_seconds`.
    `maybe_applied`: the request may have reached the server and taken effect (its answer was lost,
    or the server failed while serving it); False when it was never sent or refused before it acted."""

    def __init__(self, detail: str, retry_after_seconds: float, *, maybe_applied: bool = False) -> None:
        super().__init__(detail)
        self.detail = detail
        self.maybe_applied = maybe_applied
        self.retry_after_seconds = retry_after_seconds


log = logging.getLogger(__name__)
# Statuses the API server gives about its own state, never about a well-formed request of the gateway.
UNAVAILABLE_STATUSES = frozenset({401, 403, 429, 500, 502, 503, 504})
UNAVAILABLE_RETRY_AFTER_SECONDS = 2.0
# A 429 means the API server refused the request before acting on it (API Priority and Fairness,
# or a resource's storage still initializing just after its CRD was established), so any request,
# a write too, can be sent again once the server's Retry-After has passed.
TOO_MANY_REQUESTS_ATTEMPTS = 8
MAX_RETRY_AFTER_SECONDS = 5.0


async def make_api_client(kubeconfig: str | None) -> client.ApiClient:
    """The shared client (`client_environment.make_api_client`), its failures typed for the gateway."""
    api_client = await client_environment.make_api_client(kubeconfig)
    _retry_then_type_failures(api_client.rest_client)
    return api_client


def _retry_then_type_failures(rest_client: Any) -> None:
    """Every request of this client (each verb goes through `request`) waits out 429s, and a server
    that is away or answers about itself comes out as `Unavailable`, never as the client's errors.
    Checked against kubernetes-asyncio 36.1.0 (tests/unit/test_pinned_upstream.py fails if it changes)."""
    send = rest_client.request

    async def request(*args: Any, **kwargs: Any) -> Any:
        for attempt in range(1, TOO_MANY_REQUESTS_ATTEMPTS + 1):
            try:
                return await send(*args, **kwargs)
            except ApiException as exc:
                if exc.status == 429 and attempt < TOO_MANY_REQUESTS_ATTEMPTS:
                    await asyncio.sleep(_retry_after(exc))
                    continue
                if exc.status in UNAVAILABLE_STATUSES and not _refused_by_policy(exc):
                    raise unavailable(exc) from exc
                raise
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                raise unavailable(exc) from exc
        raise AssertionError("unreachable")

    rest_client.request = request


def _refused_by_policy(exc: ApiException) -> bool:
    """A 403 about the request itself (a ResourceQuota, an admission webhook or policy), not the
    gateway's identity: RBAC's refusals say the user "cannot" do the verb."""
    return exc.status == 403 and "cannot " not in str(exc.body)


def unavailable(exc: Exception) -> Unavailable:
    if isinstance(exc, ApiException):
        if exc.status in (401, 403):
            # The gateway's own identity refused: a starting server, or RBAC the chart did not grant.
            log.error("the API server refused the gateway's identity (%s %s)", exc.status, exc.reason)
        retry_after = _retry_after(exc) if exc.status in (429, 503) else UNAVAILABLE_RETRY_AFTER_SECONDS
        # 401, 403, 429 and 503 refuse before acting; 500, 502 and 504 may come after the write.
        applied = exc.status in (500, 502, 504)
        detail = f"the Kubernetes API answered {exc.status} {exc.reason}"
        return Unavailable(detail, retry_after, maybe_applied=applied)
    detail = f"the Kubernetes API is unreachable ({type(exc).__name__})"
    # No connection: nothing was sent. A lost answer (timeout, disconnect): the write may have landed.
    applied = not isinstance(exc, aiohttp.ClientConnectorError)
    return Unavailable(detail, UNAVAILABLE_RETRY_AFTER_SECONDS, maybe_applied=applied)


def _retry_after(exc: ApiException) -> float:
    headers: Any = exc.headers
    try:
        seconds = float(headers.get("Retry-After", 1)) if headers else 1.0
    except ValueError:
        seconds = 1.0
    return min(max(seconds, 0.1), MAX_RETRY_AFTER_SECONDS)


def _episode_of(job: Obj) -> str | None:
    episode = (job.get("spec") or {}).get("episode")
    return episode if isinstance(episode, str) else None


class Kube:
    """The API, with the namespace's Episodes and AgentJobs mirrored once `mirrored` runs. Reads of the
    mirrored namespace come from the copies (an object they don't hold is read from the API, unless the
    copy saw it deleted); `read_episode` always asks the API server."""

    def __init__(self, api_client: client.ApiClient) -> None:
        self.api_client = api_client
        self.custom = client.CustomObjectsApi(api_client)
        self.episodes = Store()
        self.agentjobs = Store(index_of=_episode_of)
        self.mirrors: dict[str, Mirror] = {}
        self.namespace: str | None = None

    async def close(self) -> None:
        await self.api_client.close()

    @contextlib.asynccontextmanager
    async def mirrored(self, namespace: str) -> AsyncIterator[Kube]:
        """Mirror `namespace`'s Episodes and AgentJobs; entered once both copies are complete (the app
        is ready only then), left with both watches stopped."""
        self.namespace = namespace
        self.mirrors = {
            plural: Mirror(self.custom, namespace, plural, store)
            for plural, store in (("episodes", self.episodes), ("agentjobs", self.agentjobs))
        }
        try:
            for mirror in self.mirrors.values():
                mirror.start()
            await asyncio.gather(self.episodes.synced.wait(), self.agentjobs.synced.wait())
            yield self
        finally:
            for mirror in self.mirrors.values():
                await mirror.stop()
            self.namespace = None

    def _store(self, namespace: str, plural: str) -> Store | None:
        if namespace != self.namespace:
            return None
        return self.episodes if plural == "episodes" else self.agentjobs

    def _keep(self, namespace: str, plural: str, obj: Obj) -> Obj:
        """What the API server just answered goes into the copy; returns the newest the copy holds."""
        store = self._store(namespace, plural)
        if store is None or obj.get("kind") == "Status":
            return obj
        return store.upsert(obj)

    async def _get(self, namespace: str, plural: str, name: str, *, fresh: bool = False) -> Obj | None:
        store = self._store(namespace, plural)
        if store is not None and not fresh:
            held = store.get(name)
            if held is not None or store.known_gone(name):
                return held
        try:
            obj: Obj = await self.custom.get_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return self._keep(namespace, plural, obj)

    async def get_episode(self, namespace: str, name: str) -> Obj | None:
        return await self._get(namespace, "episodes", name)

    async def read_episode(self, namespace: str, name: str) -> Obj | None:
        """The Episode as the API server has it now (after a lost compare-and-swap, or a write)."""
        return await self._get(namespace, "episodes", name, fresh=True)

    async def get_agentjob(self, namespace: str, name: str) -> Obj | None:
        return await self._get(namespace, "agentjobs", name)

    async def read_agentjob(self, namespace: str, name: str) -> Obj | None:
        """The AgentJob as the API server has it now (after a lost precondition)."""
        return await self._get(namespace, "agentjobs", name, fresh=True)

    async def list_episodes(self, namespace: str, *, fresh: bool = False) -> list[Obj]:
        store = self._store(namespace, "episodes")
        if store is not None and not fresh:
            return store.values()
        found = await self.custom.list_namespaced_custom_object(GROUP, VERSION, namespace, "episodes")
        return [self._keep(namespace, "episodes", o) for o in found["items"]]

    async def list_agentjobs(self, namespace: str, episode: str) -> list[Obj]:
        store = self._store(namespace, "agentjobs")
        if store is not None:
            return store.by_index(episode)
        # By spec.episode, the truth (a selectable field of the CRD), not by label: the operator
        # labels a job only once it admits it.
        found = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", field_selector=f"spec.episode={episode}"
        )
        items: list[Obj] = found["items"]
        return items

    async def wait_for(
        self, namespace: str, plural: str, name: str, done: Callable[[Obj], bool], seconds: float
    ) -> Obj | None:
        """The object once `done(obj)` holds, else as it is after `seconds`; None if it is gone. Woken
        by the mirror's watch (no polling, no watch of its own)."""
        store = self._store(namespace, plural)
        if store is None:
            raise RuntimeError(f"{namespace}: not a mirrored namespace")
        if store.get(name) is None and await self._get(namespace, plural, name) is None:
            return None
        return await wait_until(store, name, done, seconds)

    async def wait_for_any(
        self,
        namespace: str,
        plural: str,
        names: list[str],
        done: Callable[[dict[str, Obj | None]], bool],
        seconds: float,
    ) -> dict[str, Obj | None]:
        """The objects `names` (None: gone) once `done` holds of them, else as they are after
        `seconds`; woken by the mirror's watch. The caller has read each of them already."""
        store = self._store(namespace, plural)
        if store is None:
            raise RuntimeError(f"{namespace}: not a mirrored namespace")
        return await wait_any(store, names, done, seconds)

    async def create(self, namespace: str, plural: str, body: Obj) -> Obj:
        """Raises Refused when the schema, a quota or an admission policy refuses the object."""
        try:
            created: Obj = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, body
            )
        except ApiException as exc:
            if exc.status in (400, 403, 422):  # 403 here: a quota or an admission policy
                raise Refused.of(exc) from exc
            raise
        return self._keep(namespace, plural, created)

    async def append_provenance(self, namespace: str, body: Obj) -> bool:
        """Create a ProvenanceRecord; False when its name is taken (another writer got there first)."""
        try:
            await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "provenancerecords", body
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def list_provenance(self, namespace: str, episode: str) -> list[Obj]:
        found = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "provenancerecords", field_selector=f"spec.episode={episode}"
        )
        items: list[Obj] = found["items"]
        return items

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
        self._keep(namespace, "episodes", patched)
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
            answer = await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "episodes", name
            )
        except ApiException as exc:
            if exc.status != 404:
                raise
            return
        self._deleted(namespace, "episodes", answer)

    async def set_steps(self, namespace: str, name: str, current: Obj, steps: int) -> Obj:
        """Write status.steps only if neither it nor the phase changed since `current` was read (else
        Conflict): no step is counted on an Episode that ended after the caller's copy was read."""
        status = current.get("status") or {}
        if "steps" in status and "phase" in status:
            # JSON-patch tests on those fields: unrelated status writes (the ledger) don't conflict.
            body: Any = [
                {"op": "test", "path": "/status/steps", "value": status["steps"]},
                {"op": "test", "path": "/status/phase", "value": status["phase"]},
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

    async def delete_agentjob(self, namespace: str, name: str, resource_version: str) -> bool:
        """Delete the job only as it was at `resource_version` (else Conflict: it changed since it was
        read); False when it is gone already."""
        preconditions = client.V1Preconditions(resource_version=resource_version)
        options = client.V1DeleteOptions(propagation_policy="Background", preconditions=preconditions)
        try:
            answer = await self.custom.delete_namespaced_custom_object(
                GROUP, VERSION, namespace, "agentjobs", name, body=options
            )
        except ApiException as exc:
            if exc.status == 404:
                return False
            if exc.status == 409:
                raise Conflict(f"agentjob {namespace}/{name} changed since it was read") from exc
            raise
        self._deleted(namespace, "agentjobs", answer)
        return True

    def _deleted(self, namespace: str, plural: str, answer: Any) -> None:
        """A delete's answer: the object still finalizing (deletionTimestamp set), or gone."""
        store = self._store(namespace, plural)
        if store is None or not isinstance(answer, dict) or answer.get("kind") == "Status":
            return
        if answer.get("metadata", {}).get("deletionTimestamp"):
            store.upsert(answer)
        else:
            store.delete(answer)
