"""Wire the operator together from its settings: API client, backends, context, poller."""

from __future__ import annotations

import asyncio
import gc
import logging
import socket
from datetime import UTC, datetime
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST

from graders.tasks import task_names
from posttrain_operator.backends.base import CREDENTIALS_MISSING, Backend, Health, SupportsHealthCheck
from posttrain_operator.backends.hf_client import HfJobsConfig, install_client_timeout
from posttrain_operator.backends.hf_jobs import HfJobsBackend
from posttrain_operator.backends.pods import Flavor, PodsBackend, PodsConfig
from posttrain_operator.backends.unavailable import UnavailableBackend
from posttrain_operator.config import OperatorSettings
from posttrain_operator.k8s import Kube, make_api_client
from posttrain_operator.metrics import COLLECTOR_PAUSES
from posttrain_operator.reconcile.context import Context

log = logging.getLogger(__name__)

# CPython's collector thresholds for the operator (defaults: 700, 10, 10). kopf's views of a body and
# a patch point back at their parent, so every event's body is in a cycle that only the collector
# frees, and in-flight work and caches reach the oldest generation fast. With the defaults a full
# collection, which scans every object, ran every few seconds in a burst of 10,000 admissions (a
# quarter of the operator's time, pauses of 1-2.5 s) and every 90 s when idle (0.6 s each). These
# young generations let more of an event's objects die young, and a full collection waits for 50
# middle ones (docs/benchmarks.md, "The garbage collector").
GC_THRESHOLDS = (10_000, 10, 50)


def settle_garbage_collector() -> None:
    """Once start-up has imported and built everything: its objects (modules, classes, settings) move
    to the permanent generation, which no collection scans, and the thresholds above apply."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)
    COLLECTOR_PAUSES.install()


def build_backends(settings: OperatorSettings, api_client: Any = None) -> dict[str, Backend]:
    """`api_client` (a kubernetes_asyncio ApiClient) is needed only by the pods backend."""
    backends: dict[str, Backend] = {}
    if settings.hf_enabled:
        backends["hf-jobs"] = _hf_jobs_backend(settings)
    if settings.pods_enabled:
        if api_client is None:
            raise ValueError("the pods backend needs a Kubernetes API client")
        backends["pods"] = _pods_backend(settings, api_client)
    return backends


def _hf_jobs_backend(settings: OperatorSettings) -> Backend:
    token = settings.hf_token_value
    if token is None:
        return UnavailableBackend(
            "hf-jobs",
            Health(
                CREDENTIALS_MISSING,
                f"HF Jobs is enabled but its token is missing or empty ({settings.hf_token_source}); "
                "create it and restart the operator",
            ),
        )
    assert settings.hf_namespace is not None
    backend = HfJobsBackend(
        HfJobsConfig(
            endpoint=settings.hf_endpoint,
            token=token,
            namespace=settings.hf_namespace,
            image=settings.hf_image,
            bucket=settings.hf_bucket_id,
            instance=settings.instance,
            http_timeout_s=settings.hf_http_timeout_seconds,
            package_index=settings.hf_package_index or None,
            package_repo=settings.hf_package_repo or None,
            staging_dir=settings.hf_staging_dir or None,
            max_package_bytes=settings.max_package_bytes,
        )
    )
    install_client_timeout(settings.hf_http_timeout_seconds, backend.stats)
    return backend


def _pods_backend(settings: OperatorSettings, api_client: Any) -> Backend:
    assert settings.pods_store_volume is not None and settings.pods_store_path is not None
    flavors = {
        name: Flavor(
            f.cpu,
            f.memory,
            f.price_micro_usd_per_minute,
            shm_size=f.shm_size,
            cpu_request=f.cpu_request,
            memory_request=f.memory_request,
            gpus=f.gpus,
            node_selector=f.node_selector,
            tolerations=tuple(f.tolerations),
            runtime_class_name=f.runtime_class_name,
            priority_class_name=f.priority_class_name,
            queue=f.queue,
        )
        for name, f in settings.pods_flavors.items()
    }
    return PodsBackend(
        PodsConfig(
            image=settings.pods_image,
            flavors=flavors,
            store_volume=settings.pods_store_volume,
            store_path=settings.pods_store_path,
            instance=settings.instance,
            namespace_prefix=settings.pods_namespace_prefix,
            scratch_size=settings.pods_scratch_size,
            cancel_grace_seconds=settings.pods_cancel_grace_seconds,
            max_log_bytes=settings.max_artifact_bytes,
            egress_probes=egress_probes(settings) if settings.pods_egress_check else None,
            egress_bound_seconds=settings.pods_egress_bound_seconds,
            package_index=settings.pods_package_index,
            package_arch=settings.pods_package_arch,
            max_package_bytes=settings.max_package_bytes,
            loopback_seccomp_profile=settings.pods_loopback_seccomp_profile or None,
        ),
        api_client,
    )


def egress_probes(settings: OperatorSettings) -> tuple[dict[str, Any], ...]:
    """What job pods must find closed: the configured probes, this operator's broker, and the
    gateway's Service (resolved here: job pods cannot resolve names, or must not)."""
    probes = [p.model_dump() for p in settings.pods_egress_probes]
    if settings.pod_ip:
        probes.append({"name": "operator-broker", "host": settings.pod_ip, "port": settings.broker_port})
    if settings.pods_gateway_host:
        try:
            infos = socket.getaddrinfo(settings.pods_gateway_host, settings.pods_gateway_port, socket.AF_INET)
        except OSError as exc:
            log.warning(
                "cannot resolve the gateway %s for the egress check: %s", settings.pods_gateway_host, exc
            )
            infos = []
        for host in sorted({str(info[4][0]) for info in infos}):
            probes.append({"name": "gateway", "host": host, "port": settings.pods_gateway_port})
    return tuple(probes)


class EventRecorder:
    """Posts Kubernetes Events without blocking the caller (kopf.event only works inside handlers,
    and the poller is not one). A failed post is logged, never raised: events are best effort."""

    def __init__(self, kube: Kube, component: str) -> None:
        self.kube = kube
        self.component = component
        self._pending: set[asyncio.Task[None]] = set()

    def __call__(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        task = asyncio.get_running_loop().create_task(self._post(body, type_, reason, message))
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    async def _post(self, body: dict[str, Any], type_: str, reason: str, message: str) -> None:
        meta = body["metadata"]
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        event = {
            "metadata": {"generateName": f"{meta['name']}.", "namespace": meta["namespace"]},
            "involvedObject": {
                "apiVersion": body.get("apiVersion"),
                "kind": body.get("kind"),
                "name": meta["name"],
                "namespace": meta["namespace"],
                "uid": meta.get("uid"),
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": self.component},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await self.kube.create_event(meta["namespace"], event)
        except Exception as exc:
            log.debug("posting event %s for %s failed: %s", reason, meta["name"], exc)


async def build_context(settings: OperatorSettings) -> Context:
    api_client = await make_api_client()
    kube = Kube.connect(api_client)
    ctx = Context(
        kube=kube,
        backends=build_backends(settings, api_client),
        settings=settings,
        emit=EventRecorder(kube, settings.instance),
    )
    ctx.metrics.watch_backends(lambda: {name: b.stats for name, b in ctx.backends.items()})
    return ctx


async def check_backends(ctx: Context) -> None:
    """Each backend's credentials, checked once at start-up: logged (never the token), reported by the
    broker's /healthz, and set as a condition on Episodes that start on that backend."""
    for name, backend in ctx.backends.items():
        if isinstance(backend, SupportsHealthCheck):
            health = await backend.check()
        else:
            health = Health(None, "no credentials to check")
        ctx.health[name] = health
        if health.ok:
            log.info("backend %s: %s", name, health.message)
        else:
            log.warning("backend %s is not usable (%s): %s", name, health.reason, health.message)


# The policy's variable that lists the registered tasks (helm/.../admission-policy.yaml).
REGISTERED_TASKS_VARIABLE = "registered"


def registered_tasks_variables(names: list[str]) -> list[dict[str, str]]:
    """The task policy's `spec.variables`: the registered task names as a CEL list literal (the names
    match ^[a-z][a-z0-9_]*$, so they need no escaping)."""
    literal = "[" + ", ".join(f"'{name}'" for name in names) + "]"
    return [{"name": REGISTERED_TASKS_VARIABLE, "expression": literal}]


async def publish_registered_tasks(ctx: Context) -> None:
    """Write the tasks this operator's image has installed into the chart's task admission policy,
    so the API server refuses an Episode naming any other (the chart keeps the list across upgrades)."""
    names = task_names()  # a broken task plugin stops the operator here, at start, and says which
    name = ctx.settings.task_policy_name
    if name is None:
        return
    variables = registered_tasks_variables(names)
    policy = await ctx.kube.get_admission_policy(name)
    if policy is None:
        log.warning("task admission policy %s is missing: Episodes are not checked against the tasks", name)
        return
    if (policy.get("spec") or {}).get("variables") != variables:
        await ctx.kube.patch_admission_policy(name, {"spec": {"variables": variables}})
    log.info("registered tasks (in policy %s): %s", name, ", ".join(names))


async def serve_metrics(ctx: Context) -> web.AppRunner:
    """GET /metrics in the Prometheus text format, on the metrics port (nothing else is served there)."""

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(body=ctx.metrics.exposition(), headers={"Content-Type": CONTENT_TYPE_LATEST})

    app = web.Application(client_max_size=1024)
    app.router.add_get("/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, ctx.settings.metrics_host, ctx.settings.metrics_port).start()
    log.info("metrics listening on %s:%d", ctx.settings.metrics_host, ctx.settings.metrics_port)
    return runner
