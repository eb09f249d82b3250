"""kopf registration: thin handlers that delegate to the reconcilers.

Run with `kopf run -m posttrain_operator.handlers --all-namespaces`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable
from typing import Any

import kopf

from posttrain_operator import broker
from posttrain_operator.api.models import GROUP, VERSION
from posttrain_operator.backends.base import BackendError
from posttrain_operator.config import OperatorSettings
from posttrain_operator.k8s import Conflict
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.episode import finalize_episode, reconcile_episode
from posttrain_operator.reconcile.jobs import Retry
from posttrain_operator.reconcile.poller import ActiveJobs, poll_forever
from posttrain_operator.runtime import build_context, serve_metrics

EPISODES = (GROUP, VERSION, "episodes")
AGENTJOBS = (GROUP, VERSION, "agentjobs")
log = logging.getLogger(__name__)


def _namespaced(namespace: str | None) -> str:
    assert namespace is not None, "both kinds are namespaced"
    return namespace


async def _run(memo: kopf.Memo, kind: str, step: Awaitable[Any]) -> None:
    """Transient failures become kopf retries; the reconcilers are idempotent, so a retry is safe."""
    try:
        await step
    except Exception as exc:
        memo.ctx.metrics.reconcile_errors.labels(kind, type(exc).__name__).inc()
        if isinstance(exc, Retry):
            raise kopf.TemporaryError(str(exc), delay=exc.delay) from exc
        if isinstance(exc, (Conflict, BackendError)):
            raise kopf.TemporaryError(str(exc), delay=5) from exc
        raise


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    config = OperatorSettings()
    settings.persistence.finalizer = config.finalizer
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=config.annotation_prefix)
    # No handler reacts to changes (specs are immutable, or read fresh on every tick), so the labels
    # the operator adds need not count as one: without this, each costs kopf a diff-base patch.
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix=config.annotation_prefix, ignored_fields=["metadata.labels"]
    )
    # Long watches without a server-side timeout can silently stall (nolar/kopf#585, #1012).
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    # kopf posts an Event per handler run by default; ours are posted where they mean something.
    settings.posting.level = logging.WARNING
    logging.getLogger("httpx2").setLevel(logging.WARNING)
    memo.ctx = await build_context(config)
    memo.active = ActiveJobs()
    memo.poller = asyncio.create_task(poll_forever(memo.ctx, memo.active))
    memo.broker = await broker.serve(memo.ctx)
    memo.metrics = await serve_metrics(memo.ctx)
    log.info("posttrain-operator started with backends: %s", ", ".join(memo.ctx.backends) or "none")


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    memo.poller.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await memo.poller
    await memo.broker.cleanup()
    await memo.metrics.cleanup()
    await memo.ctx.kube.close()


@kopf.on.create(*AGENTJOBS)
@kopf.on.resume(*AGENTJOBS)
async def agentjob_reconcile(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    await _run(
        memo, "AgentJob", reconcile_agentjob(memo.ctx, _namespaced(namespace), name, observed=dict(body))
    )


# Async, so kopf runs it on the event loop beside the poller and the metrics endpoint that read what
# it records (a sync handler would run in a worker thread).
@kopf.on.event(*AGENTJOBS)
async def agentjob_observe(body: kopf.Body, type: str, memo: kopf.Memo, **_: Any) -> None:
    memo.active.observe(dict(body), deleted=type == "DELETED")
    memo.ctx.metrics.view.observe_job(body, deleted=type == "DELETED")


@kopf.on.delete(*AGENTJOBS)
async def agentjob_delete(namespace: str | None, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
    ns = _namespaced(namespace)
    async with memo.ctx.locks("agentjob", ns, name):
        confirmed = await cancel_agentjob(memo.ctx, ns, name, "Deleted", "the AgentJob was deleted")
    if not confirmed:
        raise kopf.TemporaryError(
            "the backend has not confirmed the cancellation yet", delay=min(300, 5 * 2**retry)
        )


@kopf.daemon(*EPISODES, cancellation_timeout=10)
async def episode_tick(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    **_: Any,
) -> None:
    while not stopped:
        # The metrics' view of the Episode, from the same body: a tick behind at most, and no handler
        # run (or log line) per watch event.
        memo.ctx.metrics.view.observe_episode(body)
        try:
            # The body kopf keeps current from the watch: an idle tick costs no API call. kopf swaps in
            # each event's body whole and never edits one, so a shallow snapshot is enough (a deep
            # copy, managed fields and all, cost three times the tick's own work).
            await reconcile_episode(memo.ctx, _namespaced(namespace), name, dict(body))
        except Exception as exc:
            memo.ctx.metrics.reconcile_errors.labels("Episode", type(exc).__name__).inc()
            log.exception("reconciling episode %s/%s failed; retrying", namespace, name)
        await stopped.wait(memo.ctx.settings.episode_tick_seconds)
    # Stopped: the Episode is being deleted, or the operator is stopping.
    memo.ctx.metrics.view.observe_episode(body, deleted=True)


@kopf.on.delete(*EPISODES)
async def episode_delete(namespace: str | None, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
    if not await finalize_episode(memo.ctx, _namespaced(namespace), name):
        raise kopf.TemporaryError(
            "waiting for the backend to confirm cancellations", delay=min(300, 5 * 2**retry)
        )
