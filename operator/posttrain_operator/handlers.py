"""kopf registration: thin handlers that delegate to the reconcilers.

Run with `kopf run -m posttrain_operator.handlers --all-namespaces`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from collections.abc import Awaitable
from datetime import UTC, datetime, timedelta
from typing import Any

import kopf

from posttrain_operator import broker, lean_watch
from posttrain_operator.api.models import GROUP, VERSION
from posttrain_operator.api.rules import FINALIZER
from posttrain_operator.backends.base import BackendError
from posttrain_operator.config import OperatorSettings
from posttrain_operator.k8s import Conflict
from posttrain_operator.leader import Leadership
from posttrain_operator.reconcile.admission import reconcile_agentjob
from posttrain_operator.reconcile.cancellation import cancel_agentjob
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.ending import finalize_episode
from posttrain_operator.reconcile.episode import Quiet, reconcile_episode
from posttrain_operator.reconcile.jobs import Retry
from posttrain_operator.reconcile.judging import apply_judge_finding
from posttrain_operator.reconcile.orphan_records import orphans_index_entry
from posttrain_operator.reconcile.poller import ActiveJobs, poll_forever
from posttrain_operator.reconcile.quotas import keep_quotas
from posttrain_operator.runtime import (
    build_context,
    check_backends,
    publish_registered_tasks,
    serve_metrics,
    settle_garbage_collector,
)

EPISODES = (GROUP, VERSION, "episodes")
AGENTJOBS = (GROUP, VERSION, "agentjobs")
JUDGEFINDINGS = (GROUP, VERSION, "judgefindings")
log = logging.getLogger(__name__)


def _namespaced(namespace: str | None) -> str:
    assert namespace is not None, "every kind is namespaced"
    return namespace


MAX_RETRY_DELAY = 300.0
LOST_LEADERSHIP_EXIT = 75


def backoff(base: float, attempt: int) -> float:
    """Doubling delays from `base`, capped: a cause that persists costs a few calls an hour."""
    return float(min(MAX_RETRY_DELAY, base * 2 ** min(attempt, 16)))


async def _run(memo: kopf.Memo, kind: str, step: Awaitable[Any], retry: int) -> None:
    """Transient failures become kopf retries with backoff; the reconcilers are idempotent, so a retry
    is safe. kopf logs these without a traceback."""
    try:
        await step
    except Exception as exc:
        memo.ctx.metrics.reconcile_errors.labels(kind, type(exc).__name__).inc()
        if isinstance(exc, Retry):
            raise kopf.TemporaryError(str(exc), delay=backoff(exc.delay, retry)) from exc
        if isinstance(exc, (Conflict, BackendError)):
            raise kopf.TemporaryError(str(exc), delay=backoff(5, retry)) from exc
        raise


@kopf.on.login()
async def login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """kopf's own login (kubernetes_asyncio: in-cluster, else KUBECONFIG), with an expiry: kopf logs
    in again once it passes, so a rotated token is picked up before the old one is refused."""
    info = await kopf.login_via_async_client(**kwargs)
    if info is None:
        return None
    refresh = timedelta(seconds=OperatorSettings().credentials_refresh_seconds)
    return dataclasses.replace(info, expiration=datetime.now(UTC) + refresh)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    lean_watch.install()  # before kopf's watchers start, which is when this handler returns
    config = OperatorSettings()
    settings.persistence.finalizer = FINALIZER
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
    logging.getLogger("kopf.objects").addFilter(_drop_observer_successes)
    memo.ctx = await build_context(config)
    await check_backends(memo.ctx)
    memo.metrics = await serve_metrics(memo.ctx)
    memo.leadership = None
    if config.leader_election_namespace:
        # kopf watches nothing until this handler returns: a standby replica waits right here.
        memo.ctx.standby = True
        memo.broker = await broker.serve(memo.ctx)
        memo.leadership = Leadership(
            memo.ctx.kube, config.leader_election_namespace, config.leader_election_name,
            config.leader_election_identity, config.lease_duration_seconds, config.lease_renew_seconds,
        )  # fmt: skip
        await memo.leadership.acquire(retry_every=config.lease_renew_seconds)
        await publish_registered_tasks(memo.ctx)  # as soon as this replica leads
        memo.ctx.standby = False
        memo.keeper = asyncio.create_task(memo.leadership.keep(on_lost=_lost_leadership))
    else:
        await publish_registered_tasks(memo.ctx)
        memo.broker = await broker.serve(memo.ctx)
    memo.active = ActiveJobs()
    memo.episode_changes = EpisodeChanges()
    memo.poller = asyncio.create_task(poll_forever(memo.ctx, memo.active))
    memo.quotas = asyncio.create_task(keep_quotas(memo.ctx))
    settle_garbage_collector()
    log.info("posttrain-operator started with backends: %s", ", ".join(memo.ctx.backends) or "none")


def _lost_leadership(why: str) -> None:
    """Another replica may be acting already: stop at once, without a graceful shutdown that would
    keep reconciling (the Deployment restarts this one as a standby)."""
    log.critical("lost the leader's Lease (%s); exiting", why)
    logging.shutdown()
    os._exit(LOST_LEADERSHIP_EXIT)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    for task in (memo.poller, memo.quotas, getattr(memo, "keeper", None)):
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
    if memo.leadership is not None:
        with contextlib.suppress(Exception):  # best effort: otherwise the Lease simply expires
            await memo.leadership.release()
    await memo.broker.cleanup()
    await memo.metrics.cleanup()
    await memo.ctx.kube.close()


@kopf.on.create(*AGENTJOBS)
@kopf.on.resume(*AGENTJOBS)
async def agentjob_reconcile(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any
) -> None:
    await _run(
        memo,
        "AgentJob",
        reconcile_agentjob(memo.ctx, _namespaced(namespace), name, observed=dict(body)),
        retry,
    )


# Async, so kopf runs it on the event loop beside the poller and the metrics endpoint that read what
# it records (a sync handler would run in a worker thread).
@kopf.on.event(*AGENTJOBS)
async def agentjob_observe(body: kopf.Body, type: str, memo: kopf.Memo, **_: Any) -> None:
    memo.active.observe(dict(body), deleted=type == "DELETED")
    memo.ctx.metrics.view.observe_job(body, deleted=type == "DELETED")


# kopf logs each handler's success; the observers run on every watch event of every job and Episode,
# so their successes would be most of the log, and a share of the CPU, while saying nothing. The text
# is kopf's own (`f"{handler} succeeded."`), checked against kopf 1.45.2:
# tests/unit/test_pinned_upstream.py fails if it changes.
_OBSERVER_SUCCESSES = frozenset(
    f"Handler '{observer}' succeeded." for observer in ("agentjob_observe", "episode_observe")
)


def _drop_observer_successes(record: logging.LogRecord) -> bool:
    return record.getMessage() not in _OBSERVER_SUCCESSES


@kopf.on.delete(*AGENTJOBS)
async def agentjob_delete(namespace: str | None, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
    ns = _namespaced(namespace)
    async with memo.ctx.locks("agentjob", ns, name):
        confirmed = await cancel_agentjob(memo.ctx, ns, name, "Deleted", "the AgentJob was deleted")
    if not confirmed:
        raise kopf.TemporaryError(
            "the backend has not confirmed the cancellation yet", delay=min(300, 5 * 2**retry)
        )


@kopf.on.create(*JUDGEFINDINGS)
@kopf.on.resume(*JUDGEFINDINGS)
async def judgefinding_apply(
    namespace: str | None, name: str, body: kopf.Body, memo: kopf.Memo, retry: int, **_: Any
) -> None:
    step = apply_judge_finding(memo.ctx, _namespaced(namespace), name, observed=dict(body))
    await _run(memo, "JudgeFinding", step, retry)


@kopf.index(*EPISODES)
async def namespace_orphans(
    namespace: str | None, name: str, status: kopf.Status, **_: Any
) -> dict[str, tuple[str, ...]]:
    return orphans_index_entry(_namespaced(namespace), name, status)


class EpisodeChanges:
    """One flag per watched Episode, set by each of its watch events: a quiet daemon sleeps until its
    Episode changes or its quiet time ends. Waking every tick to compare versions instead cost the
    event loop 1,000 wake-ups a second at 2,000 Episodes (bench/operator_scale.py, 10,000 jobs)."""

    def __init__(self) -> None:
        self._flags: dict[tuple[str, str], asyncio.Event] = {}

    def watch(self, key: tuple[str, str]) -> asyncio.Event:
        return self._flags.setdefault(key, asyncio.Event())

    def forget(self, key: tuple[str, str]) -> None:
        self._flags.pop(key, None)

    def changed(self, key: tuple[str, str]) -> None:
        if (flag := self._flags.get(key)) is not None:
            flag.set()


# kopf swaps in the daemon's live body before it runs this: a daemon woken here reads the new version.
@kopf.on.event(*EPISODES)
async def episode_observe(namespace: str | None, name: str, memo: kopf.Memo, **_: Any) -> None:
    memo.episode_changes.changed((_namespaced(namespace), name))


# kopf stops a daemon by cancelling it at once (no `cancellation_backoff`), then waits up to the
# timeout for it to finish.
@kopf.daemon(*EPISODES, cancellation_timeout=10)
async def episode_tick(
    namespace: str | None,
    name: str,
    body: kopf.Body,
    memo: kopf.Memo,
    stopped: kopf.DaemonStopped,
    **kwargs: Any,
) -> None:
    # kopf hands its indices to handlers only: the same live index for every daemon.
    memo.ctx.namespace_orphans = kwargs["namespace_orphans"]
    key = (_namespaced(namespace), name)
    memo.ctx.watched_episodes[key] = body
    changed = memo.episode_changes.watch(key)
    try:
        await _tick_until_stopped(memo.ctx, key, body, changed, stopped)
    finally:  # stopped: the Episode is being deleted, or the operator is stopping
        memo.episode_changes.forget(key)
        memo.ctx.watched_episodes.pop(key, None)
        memo.ctx.metrics.view.observe_episode(body, deleted=True)


async def _tick_until_stopped(
    ctx: Context, key: tuple[str, str], body: kopf.Body, changed: asyncio.Event, stopped: kopf.DaemonStopped
) -> None:
    namespace, name = key
    tick = ctx.settings.episode_tick_seconds
    failures = 0
    quiet = Quiet()
    while not stopped:
        changed.clear()  # before the version is read: an event from here on wakes the next wait
        version = body["metadata"].get("resourceVersion")
        if quiet.holds(version, ctx.clock()):  # unchanged and idle: nothing to decide or observe
            assert quiet.until is not None
            await wait_for_change(changed, (quiet.until - ctx.clock()).total_seconds())
            continue
        delay = tick
        # The metrics' view of the Episode, from the same body, and no handler run (or log line) for it.
        ctx.metrics.view.observe_episode(body)
        try:
            # The body kopf keeps current from the watch: an idle tick costs no API call. kopf swaps in
            # each event's body whole and never edits one, so a shallow snapshot is enough (a deep
            # copy, managed fields and all, cost three times the tick's own work). The snapshot is
            # taken after `version` was read: at worst newer than the version it is filed under.
            quiet = Quiet(version, await reconcile_episode(ctx, namespace, name, dict(body)))
            failures = 0
            if quiet.until is not None and ctx.clock() < quiet.until:
                continue  # quiet from now on: wait for a change, not a tick
        except Exception as exc:
            ctx.metrics.reconcile_errors.labels("Episode", type(exc).__name__).inc()
            failures += 1
            delay = backoff(tick, failures)
            if isinstance(exc, (Retry, Conflict, BackendError, LookupError)):
                log.warning("episode %s/%s: %s; retrying in %.0fs", namespace, name, exc, delay)
            elif failures == 1:
                # A bug: its traceback once, then one line per (backed-off) retry.
                log.exception("reconciling episode %s/%s failed; retrying in %.0fs", namespace, name, delay)
            else:
                log.warning("episode %s/%s failed again; retrying in %.0fs", namespace, name, delay)
        # Work was done or failed: the next pass a tick on, whatever changes meanwhile, so that a pass
        # whose own write wakes it does not run back to back.
        await asyncio.sleep(delay)


async def wait_for_change(changed: asyncio.Event, seconds: float) -> None:
    """Until `changed` is set or `seconds` have passed: one timer, and no task, per wait."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(seconds, 0)):
            await changed.wait()


@kopf.on.delete(*EPISODES)
async def episode_delete(namespace: str | None, name: str, memo: kopf.Memo, retry: int, **_: Any) -> None:
    if not await finalize_episode(memo.ctx, _namespaced(namespace), name):
        raise kopf.TemporaryError(
            "waiting for the backend to confirm cancellations", delay=min(300, 5 * 2**retry)
        )
