"""Kubernetes API calls the operator makes beyond kopf's own: reads, compare-and-swap status writes,
merge patches, creates, the task admission policy's list, Events, TokenReviews and SubjectAccessReviews.
Nothing here decides anything, and no other module of the operator (the pods backend aside, which owns
its own objects) calls the API."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from kubernetes_asyncio import client
from kubernetes_asyncio.client.exceptions import ApiException

from posttrain_operator import client_environment
from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.api.judging import JudgeFindingStatus
from posttrain_operator.api.models import GROUP, VERSION, AgentJobStatus, ApiModel, status_of
from posttrain_operator.api.quota import QUOTA_NAME, BudgetQuotaStatus

MERGE_PATCH = "application/merge-patch+json"
# In the API server's audit log, the reconcilers' calls (kopf's own carry "kopf/<version>").
USER_AGENT = "posttrain-operator"
CAS_ATTEMPTS = 20
T = TypeVar("T")
S = TypeVar("S", bound=ApiModel)
Obj = TypeVar("Obj")
# A compare-and-swap callback: from the object as read and its status, the status to write (None:
# nothing to write) and a result for the caller. It may run several times, so it must be pure.
Mutate = Callable[[dict[str, Any], S], tuple[S | None, T]]


@dataclass(frozen=True)
class Identity:
    """A caller as a TokenReview authenticated it."""

    username: str
    groups: tuple[str, ...] = ()
    uid: str = ""
    extra: dict[str, list[str]] = field(default_factory=dict)


class Conflict(RuntimeError):
    """A compare-and-swap lost too many races in a row."""


@dataclass(frozen=True)
class StatusUpdate(Generic[S, T]):
    body: dict[str, Any]  # the object as written, or as read when there was nothing to write
    status: S
    written: bool
    result: T  # what the last run of the callback returned


EpisodeUpdate = StatusUpdate[EpisodeStatus, T]


def drop_managed_fields(obj: Obj) -> Obj:
    """`obj` without `metadata.managedFields`, in place: the server's record of which writer set which
    field, 68 of an AgentJob's 78 dicts, which nothing in the operator reads. A write sent without them
    leaves the server's record as it is (only an explicit empty list resets it)."""
    meta = obj.get("metadata") if isinstance(obj, dict) else None
    if isinstance(meta, dict):
        meta.pop("managedFields", None)
    return obj


async def make_api_client() -> client.ApiClient:
    """In the pod: its ServiceAccount; elsewhere: KUBECONFIG (see `client_environment.make_api_client`)."""
    return await client_environment.make_api_client(user_agent=USER_AGENT)


class Kube:
    def __init__(
        self,
        custom: client.CustomObjectsApi,
        core: client.CoreV1Api,
        auth: client.AuthenticationV1Api,
        api_client: client.ApiClient | None = None,
    ) -> None:
        self.api_client = api_client
        self.custom = custom
        self.core = core
        self.auth = auth
        self._status_locks: dict[tuple[str, str, str], asyncio.Lock] = {}

    @classmethod
    def connect(cls, api_client: client.ApiClient) -> Kube:
        return cls(
            client.CustomObjectsApi(api_client),
            client.CoreV1Api(api_client),
            client.AuthenticationV1Api(api_client),
            api_client,
        )

    async def close(self) -> None:
        if self.api_client is not None:
            await self.api_client.close()

    async def _get(self, plural: str, namespace: str, name: str) -> dict[str, Any] | None:
        try:
            body: dict[str, Any] = await self.custom.get_namespaced_custom_object(
                GROUP, VERSION, namespace, plural, name
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return drop_managed_fields(body)

    async def get_episode(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("episodes", namespace, name)

    async def get_agentjob(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._get("agentjobs", namespace, name)

    async def list_agentjobs(self, namespace: str, episode: str) -> list[dict[str, Any]]:
        result = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "agentjobs", field_selector=f"spec.episode={episode}"
        )
        items: list[dict[str, Any]] = [drop_managed_fields(item) for item in result["items"]]
        return items

    async def update_episode_status(
        self,
        namespace: str,
        name: str,
        mutate: Mutate[EpisodeStatus, T],
        *,
        seen: dict[str, Any] | None = None,
    ) -> StatusUpdate[EpisodeStatus, T]:
        """Compare-and-swap on the Episode's status (see `_update_status`)."""
        return await self._update_status("episodes", EpisodeStatus, namespace, name, mutate, seen)

    async def update_quota_status(
        self, namespace: str, mutate: Mutate[BudgetQuotaStatus, T], *, seen: dict[str, Any] | None = None
    ) -> StatusUpdate[BudgetQuotaStatus, T]:
        """Compare-and-swap on the namespace's BudgetQuota status (see `_update_status`)."""
        return await self._update_status(
            "budgetquotas", BudgetQuotaStatus, namespace, QUOTA_NAME, mutate, seen
        )

    async def get_quota(self, namespace: str) -> dict[str, Any] | None:
        return await self._get("budgetquotas", namespace, QUOTA_NAME)

    async def namespaces_with_quotas(self) -> list[str]:
        """The namespaces that hold a BudgetQuota (one cluster-wide list)."""
        result = await self.custom.list_cluster_custom_object(GROUP, VERSION, "budgetquotas")
        return sorted({item["metadata"]["namespace"] for item in result["items"]})

    async def _update_status(
        self,
        plural: str,
        model: type[S],
        namespace: str,
        name: str,
        mutate: Mutate[S, T],
        seen: dict[str, Any] | None,
    ) -> StatusUpdate[S, T]:
        """Read, mutate, replace with the read's resourceVersion, and start over from a fresh read on a
        conflict. `seen`, the object as this pass already read it, saves the first read (a stale copy
        only costs a retry). Writers in this process take turns per object, so the compare-and-swap
        only ever races with other processes (the gateway's step counter, say), never with itself."""
        async with self._status_locks.setdefault((plural, namespace, name), asyncio.Lock()):
            for attempt in range(CAS_ATTEMPTS):
                body = seen if seen is not None and attempt == 0 else await self._get(plural, namespace, name)
                if body is None:
                    raise LookupError(f"{plural} {namespace}/{name} not found")
                body = dict(body)
                current = status_of(model, body.get("status"))
                new, result = mutate(body, current)
                if new is None:
                    return StatusUpdate(body, current, False, result)
                body["status"] = {**(body.get("status") or {}), **new.wire()}
                for cleared in set(current.wire()) - set(new.wire()):
                    body["status"].pop(cleared, None)
                try:
                    written: dict[str, Any] = await self.custom.replace_namespaced_custom_object_status(
                        GROUP, VERSION, namespace, plural, name, body
                    )
                except ApiException as exc:
                    if exc.status == 409:
                        if attempt == 0 and seen is not None:
                            continue  # the copy this pass had was stale: read afresh at once
                        await asyncio.sleep(random.uniform(0, 0.01 * 2 ** min(attempt, 6)))
                        continue
                    raise
                return StatusUpdate(drop_managed_fields(written), new, True, result)
        raise Conflict(f"{plural} {namespace}/{name}: status update lost {CAS_ATTEMPTS} races in a row")

    async def patch_agentjob_status(
        self, namespace: str, name: str, status: AgentJobStatus, *, partial: bool = False
    ) -> dict[str, Any]:
        """A merge patch with `status` whole (every field but unset optional ones), or, `partial`,
        with only the fields it was built with (see ApiModel.patch)."""
        body: dict[str, Any] = await self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "agentjobs",
            name,
            {"status": status.patch() if partial else status.wire()},
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )
        return drop_managed_fields(body)

    async def patch_judgefinding_status(self, namespace: str, name: str, status: JudgeFindingStatus) -> None:
        await self.custom.patch_namespaced_custom_object_status(
            GROUP,
            VERSION,
            namespace,
            "judgefindings",
            name,
            {"status": status.wire()},
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )

    async def patch_agentjob(self, namespace: str, name: str, patch: dict[str, Any]) -> dict[str, Any]:
        body: dict[str, Any] = await self.custom.patch_namespaced_custom_object(
            GROUP,
            VERSION,
            namespace,
            "agentjobs",
            name,
            patch,
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )
        return drop_managed_fields(body)

    async def create_agentjob(self, namespace: str, body: dict[str, Any]) -> dict[str, Any]:
        """Create, or return the existing object of that name (creates are retried after crashes)."""
        try:
            created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "agentjobs", body
            )
        except ApiException as exc:
            if exc.status != 409:
                raise
            existing = await self.get_agentjob(namespace, body["metadata"]["name"])
            if existing is None:
                raise
            return existing
        return drop_managed_fields(created)

    async def append_provenance(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a ProvenanceRecord; False when one of that name is there already (this record,
        written before a crash: its name is the job's or the submission's)."""
        try:
            await self.custom.create_namespaced_custom_object(
                GROUP, VERSION, namespace, "provenancerecords", body
            )
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def list_provenance(self, namespace: str, episode: str) -> list[dict[str, Any]]:
        result = await self.custom.list_namespaced_custom_object(
            GROUP, VERSION, namespace, "provenancerecords", field_selector=f"spec.episode={episode}"
        )
        items: list[dict[str, Any]] = result["items"]
        return items

    async def ensure_secret(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create a Secret unless one of that name exists; True if this call created it."""
        try:
            await self.core.create_namespaced_secret(namespace, body)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def read_secret_data(self, namespace: str, name: str) -> dict[str, str]:
        """A Secret's data, base64-encoded as the API serves it."""
        secret = await self.core.read_namespaced_secret(name, namespace)
        return dict(secret.data or {})

    async def _read_or_none(self, read: Awaitable[Any]) -> dict[str, Any] | None:
        """What a typed client's read returns, as a plain dict; None when the object does not exist."""
        assert self.api_client is not None, "typed reads need a connected client"
        try:
            found = await read
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise
        body: dict[str, Any] = self.api_client.sanitize_for_serialization(found)
        return body

    async def get_admission_policy(self, name: str) -> dict[str, Any] | None:
        assert self.api_client is not None, "admission policies need a connected client"
        policies = client.AdmissionregistrationV1Api(self.api_client)
        return await self._read_or_none(policies.read_validating_admission_policy(name))

    async def patch_admission_policy(self, name: str, patch: dict[str, Any]) -> None:
        assert self.api_client is not None, "admission policies need a connected client"
        await client.AdmissionregistrationV1Api(self.api_client).patch_validating_admission_policy(
            name,
            patch,
            _content_type=MERGE_PATCH,  # type: ignore[call-arg]
        )

    async def create_event(self, namespace: str, event: dict[str, Any]) -> None:
        # The created Event is not read: unparsed, its answer skips building the client's model of it.
        answer: Any = await self.core.create_namespaced_event(namespace, event, _preload_content=False)  # type: ignore[arg-type]
        answer.release()

    # --- the leader's Lease (coordination.k8s.io): plain dicts in and out ----------------------------

    def _leases(self) -> client.CoordinationV1Api:
        assert self.api_client is not None, "Leases need a connected client"
        return client.CoordinationV1Api(self.api_client)

    async def get_lease(self, namespace: str, name: str) -> dict[str, Any] | None:
        return await self._read_or_none(self._leases().read_namespaced_lease(name, namespace))

    async def write_lease(self, namespace: str, body: dict[str, Any]) -> bool:
        """Create the Lease (no resourceVersion) or replace it (compare-and-swap on its
        resourceVersion); False when another writer got there first."""
        try:
            if body["metadata"].get("resourceVersion"):
                name = body["metadata"]["name"]
                await self._leases().replace_namespaced_lease(name, namespace, body)  # type: ignore[arg-type]
            else:
                await self._leases().create_namespaced_lease(namespace, body)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status == 409:
                return False
            raise
        return True

    async def review_token(self, token: str) -> Identity | None:
        """Who a bearer token authenticates as (TokenReview), or None if it is rejected."""
        review = await self.auth.create_token_review(
            client.V1TokenReview(spec=client.V1TokenReviewSpec(token=token))
        )
        status = review.status
        if not (status and status.authenticated and status.user and status.user.username):
            return None
        user = status.user
        return Identity(user.username, tuple(user.groups or ()), user.uid or "", dict(user.extra or {}))

    async def may(self, who: Identity, verb: str, plural: str, namespace: str) -> bool:
        """Whether RBAC lets `who` do `verb` on this group's `plural` in `namespace` (SubjectAccessReview)."""
        api = client.AuthorizationV1Api(self.api_client)
        review = await api.create_subject_access_review(
            client.V1SubjectAccessReview(
                spec=client.V1SubjectAccessReviewSpec(
                    user=who.username,
                    groups=list(who.groups),
                    uid=who.uid or None,
                    extra=who.extra or None,
                    resource_attributes=client.V1ResourceAttributes(
                        group=GROUP, resource=plural, verb=verb, namespace=namespace
                    ),
                )
            )
        )
        return bool(review.status and review.status.allowed)
