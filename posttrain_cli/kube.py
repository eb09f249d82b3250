"""The official synchronous Kubernetes client, configured as kubectl is: KUBECONFIG (or
~/.kube/config, or the in-cluster config), `--context`, and the context's namespace unless
`--namespace` says otherwise. The only module of the CLI that talks to the API server."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException
from posttrain_operator.api.models import GROUP, VERSION
from posttrain_operator.api.rules import EPISODE_LABEL

Obj = dict[str, Any]
MERGE_PATCH = "application/merge-patch+json"


class CliError(Exception):
    """A failure the user can act on: printed without a traceback, exit status 1."""


@dataclass
class Cluster:
    api: client.ApiClient
    namespace: str

    @classmethod
    def connect(cls, kubeconfig: str | None, context: str | None, namespace: str | None) -> Cluster:
        path = kubeconfig or os.environ.get("KUBECONFIG") or None
        try:
            api = config.new_client_from_config(config_file=path, context=context)  # type: ignore[no-untyped-call]
            default_ns = _context_namespace(path, context)
        except config.ConfigException:
            if kubeconfig or context:
                raise
            config.load_incluster_config()  # type: ignore[no-untyped-call]
            api = client.ApiClient()
            default_ns = _incluster_namespace()
        return cls(api, namespace or default_ns)

    @property
    def custom(self) -> Any:  # the client's generated methods return `object`: we read JSON dicts
        return client.CustomObjectsApi(self.api)

    def bearer_token(self) -> str | None:
        """The caller's own bearer token, as kubectl would send it (None for client certificates)."""
        # Through the client's own lookup, which runs its refresh hook (exec plugins, expiring tokens).
        header = self.api.configuration.get_api_key_with_prefix("BearerToken", alias="authorization") or ""
        return str(header).removeprefix("Bearer ").strip() or None

    def episodes(self, all_namespaces: bool = False) -> list[Obj]:
        if all_namespaces:
            found = self.custom.list_cluster_custom_object(GROUP, VERSION, "episodes")
        else:
            found = self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "episodes")
        items: list[Obj] = found["items"]
        return sorted(items, key=lambda e: (e["metadata"]["namespace"], e["metadata"]["name"]))

    def episode(self, name: str) -> Obj:
        return self._get("episodes", name)

    def agentjob(self, name: str) -> Obj:
        return self._get("agentjobs", name)

    def agentjobs(self, episode: str | None = None) -> list[Obj]:
        selector = f"{EPISODE_LABEL}={episode}" if episode else ""
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "agentjobs", label_selector=selector
        )
        items: list[Obj] = found["items"]
        if episode:  # a job not yet adopted (labelled) by the operator names its episode in spec
            unlabelled = self.custom.list_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "agentjobs"
            )
            known = {j["metadata"]["name"] for j in items}
            items += [
                j
                for j in unlabelled["items"]
                if j["spec"].get("episode") == episode and j["metadata"]["name"] not in known
            ]
        return sorted(items, key=lambda j: (j["metadata"]["creationTimestamp"], j["metadata"]["name"]))

    def provenance(self, episode: str) -> list[Obj]:
        found = self.custom.list_namespaced_custom_object(
            GROUP, VERSION, self.namespace, "provenancerecords", field_selector=f"spec.episode={episode}"
        )
        items: list[Obj] = found["items"]
        return items

    def quota(self) -> Obj | None:
        """The namespace's BudgetQuota (always named default), or None when it has none."""
        try:
            body: Obj = self.custom.get_namespaced_custom_object(
                GROUP, VERSION, self.namespace, "budgetquotas", "default"
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _explained(exc, f"budgetquota {self.namespace}/default") from exc
        return body

    def _get(self, plural: str, name: str) -> Obj:
        try:
            body: Obj = self.custom.get_namespaced_custom_object(GROUP, VERSION, self.namespace, plural, name)
        except ApiException as exc:
            raise _explained(exc, f"{plural[:-1]} {self.namespace}/{name}") from exc
        return body

    def watch_episodes(self, timeout_seconds: int) -> Iterator[tuple[str, Obj]]:
        stream = watch.Watch().stream(  # type: ignore[no-untyped-call]
            self.custom.list_namespaced_custom_object,
            GROUP,
            VERSION,
            self.namespace,
            "episodes",
            timeout_seconds=timeout_seconds,
        )
        for event in stream:
            yield event["type"], event["object"]

    def may(self, verb: str, plural: str, subresource: str | None = None) -> bool:
        """Whether RBAC lets the caller do `verb` on this group's `plural` here (SelfSubjectAccessReview)."""
        attributes = client.V1ResourceAttributes(
            group=GROUP, resource=plural, verb=verb, namespace=self.namespace, subresource=subresource
        )
        review = client.AuthorizationV1Api(self.api).create_self_subject_access_review(
            client.V1SelfSubjectAccessReview(
                spec=client.V1SelfSubjectAccessReviewSpec(resource_attributes=attributes)
            )
        )
        return bool(review.status and review.status.allowed)

    def patch_episode_status(self, name: str, patch: Obj) -> Obj:
        try:
            body: Obj = self.custom.patch_namespaced_custom_object_status(
                GROUP, VERSION, self.namespace, "episodes", name, patch, _content_type=MERGE_PATCH
            )
        except ApiException as exc:
            raise _explained(exc, f"episode {self.namespace}/{name}") from exc
        return body


def _explained(exc: ApiException, what: str) -> CliError:
    if exc.status == 404:
        return CliError(f"{what} not found")
    if exc.status == 403:
        return CliError(f"forbidden: you may not read or change {what}")
    return CliError(f"{what}: the API server answered {exc.status} {exc.reason}")


def _context_namespace(path: str | None, context: str | None) -> str:
    contexts, active = config.list_kube_config_contexts(config_file=path)  # type: ignore[no-untyped-call]
    chosen = next((c for c in contexts if c["name"] == context), None) if context else active
    if context and chosen is None:
        raise CliError(f"no context {context!r} in the kubeconfig")
    return str(((chosen or {}).get("context") or {}).get("namespace") or "default")


def _incluster_namespace() -> str:
    path = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
    try:
        with open(path) as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"
