"""An episode's namespace on the pods backend: created (or adopted when it is this operator's for the
episode), given its default-deny NetworkPolicy and verified isolated before any pod; deleted once the
episode is done."""

from __future__ import annotations

import contextlib

from kubernetes_asyncio.client.exceptions import ApiException

from posttrain_operator.backends.base import BackendError, JobRequest
from posttrain_operator.backends.pods.kube_calls import KubeCalls, wire
from posttrain_operator.backends.pods.manifests import is_default_deny, namespace_body, network_policy_body
from posttrain_operator.backends.pods.names import (
    EPISODE_ANNOTATION,
    MANAGED_LABEL,
    NETWORK_POLICY,
    label_value,
)


async def prepare_namespace(calls: KubeCalls, name: str, request: JobRequest) -> None:
    await _ensure_namespace(calls, name, request)
    await _ensure_network_policy(calls, name)
    await _verify_isolation(calls, name)


async def _ensure_namespace(calls: KubeCalls, name: str, request: JobRequest) -> None:
    config = calls.config
    body = namespace_body(config, name, request.namespace, request.episode)
    try:
        await calls.call(
            "create_namespace",
            lambda: calls.core.create_namespace(wire(body), _request_timeout=calls.timeout),
            passthrough=(409,),
        )
        return
    except ApiException:
        pass
    existing = await calls.call(
        "read_namespace", lambda: calls.core.read_namespace(name, _request_timeout=calls.timeout)
    )
    meta = existing["metadata"]
    ours = (meta.get("labels") or {}).get(MANAGED_LABEL) == label_value(config.instance) and (
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


async def _ensure_network_policy(calls: KubeCalls, namespace: str) -> None:
    body = network_policy_body(calls.config, namespace)
    with contextlib.suppress(ApiException):  # 409 exists: _verify_isolation checks what it says
        await calls.call(
            "create_namespaced_network_policy",
            lambda: calls.net.create_namespaced_network_policy(
                namespace, wire(body), _request_timeout=calls.timeout
            ),
            passthrough=(409,),
        )


async def _verify_isolation(calls: KubeCalls, namespace: str) -> None:
    """Read back, right before a pod is created, that the namespace's only NetworkPolicy is our
    default deny. Policies are additive: any other one could allow traffic."""
    listed = await calls.call(
        "list_namespaced_network_policy",
        lambda: calls.net.list_namespaced_network_policy(namespace, _request_timeout=calls.timeout),
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


async def delete_namespace(calls: KubeCalls, name: str) -> bool:
    """True once the API server reports the namespace gone."""
    for method, fn in (
        ("delete_namespace", lambda: calls.core.delete_namespace(name, _request_timeout=calls.timeout)),
        ("read_namespace", lambda: calls.core.read_namespace(name, _request_timeout=calls.timeout)),
    ):
        try:
            await calls.call(method, fn, passthrough=(404,))
        except ApiException:
            return True
    return False
