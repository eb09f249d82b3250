"""The operator's Prometheus metrics, each in one registry per process.

Labels are low-cardinality only (phases, purposes, reasons, API methods, and the namespace, task and
backend spend is charged to): never an episode or job name, so a cluster running thousands of
episodes exposes the same number of series as one running a single episode per namespace and task.
What the watch already shows (episodes and jobs by phase, orphans, quotas) is counted at scrape time
from the last body each watch or pass delivered, so it costs nothing per reconcile.
"""

from __future__ import annotations

import functools
import gc
import math
import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeHistogramMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from posttrain_operator.backends.base import CallStats

# Create -> Admitted covers a watch event, two reads, a ledger compare-and-swap: milliseconds to
# seconds on a healthy cluster, up to minutes when the API server or the price lookup struggles.
ADMISSION_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
REWARD_BUCKETS = (0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, math.inf)
NONE = "None"  # the label value of a phase or outcome not set yet


SPEND_LABELS = ("namespace", "task", "backend")


def spend_labels(episode: Mapping[str, Any]) -> tuple[str, str, str]:
    """Whom an Episode's spend is charged to: its namespace (the team), task and backend."""
    spec = episode.get("spec") or {}
    return episode["metadata"]["namespace"], str(spec.get("task") or NONE), str(spec.get("backend") or NONE)


@dataclass(frozen=True)
class EpisodeSeen:
    charged_to: tuple[str, str, str]
    phase: str
    outcome: str
    orphans: int
    budget: int
    reserved: int
    settled: int
    reward: float | None


@dataclass(frozen=True)
class QuotaSeen:
    """A namespace's BudgetQuota figures for its current window, in micro-dollars."""

    limit: int
    reserved: int
    settled: int
    platform: int


class WatchView:
    """Episodes and AgentJobs as the watches last delivered them, reduced to what the gauges show."""

    def __init__(self) -> None:
        self.episodes: dict[tuple[str, str], EpisodeSeen] = {}
        self.jobs: dict[tuple[str, str], tuple[str, str]] = {}
        self.quotas: dict[str, QuotaSeen] = {}

    def observe_quota(self, namespace: str, seen: QuotaSeen | None) -> None:
        if seen is None:
            self.quotas.pop(namespace, None)
        else:
            self.quotas[namespace] = seen

    def observe_episode(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        _keep(self.episodes, body, None if deleted else _episode_seen(body))

    def observe_job(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        status = body.get("status") or {}
        purpose = (body.get("spec") or {}).get("purpose") or NONE
        _keep(self.jobs, body, None if deleted else (status.get("phase") or "Pending", purpose))


Seen = TypeVar("Seen")


def _keep(table: dict[tuple[str, str], Seen], body: Mapping[str, Any], seen: Seen | None) -> None:
    """What the view holds of an object, by (namespace, name); None: it is gone."""
    key = (body["metadata"]["namespace"], body["metadata"]["name"])
    if seen is None:
        table.pop(key, None)
    else:
        table[key] = seen


def _episode_seen(body: Mapping[str, Any]) -> EpisodeSeen:
    status = body.get("status") or {}
    ledger = status.get("ledger") or {}
    reward = status.get("reward")
    return EpisodeSeen(
        charged_to=spend_labels(body),
        phase=status.get("phase") or "Pending",
        outcome=status.get("outcome") or NONE,
        orphans=len(status.get("orphanedJobs") or []),
        budget=int(ledger.get("budgetMicroUSD") or 0),
        reserved=int(ledger.get("reservedMicroUSD") or 0),
        settled=int(ledger.get("settledMicroUSD") or 0),
        reward=float(reward) if reward is not None else None,
    )


class _ViewCollector(Collector):
    def __init__(self, view: WatchView) -> None:
        self.view = view

    def collect(self) -> Iterator[Metric]:
        episodes = GaugeMetricFamily(
            "posttrain_episodes",
            "Episodes by phase and outcome, namespace, task and backend, as the watch sees them",
            labels=["phase", "outcome", *SPEND_LABELS],
        )
        seen = list(self.view.episodes.values())
        for (phase, outcome, *charged_to), n in sorted(
            Tally((e.phase, e.outcome, *e.charged_to) for e in seen).items()
        ):
            episodes.add_metric([phase, outcome, *charged_to], n)
        yield episodes
        for name, field_, what in (
            ("budget", "budget", "Budgets"),
            ("reserved", "reserved", "Reservations on the ledgers"),
            ("settled", "settled", "Settled agent spend"),
        ):
            family = GaugeMetricFamily(
                f"posttrain_episode_{name}_microdollars",
                f"{what} of the Episodes the watch sees, summed by phase, namespace, task and backend",
                labels=["phase", *SPEND_LABELS],
            )
            totals: Tally[tuple[str, ...]] = Tally()
            for e in seen:
                totals[(e.phase, *e.charged_to)] += getattr(e, field_)
            for labels, total in sorted(totals.items()):
                family.add_metric(list(labels), total)
            yield family
        yield self._rewards(seen)
        yield from self._quotas()
        jobs = GaugeMetricFamily(
            "posttrain_agentjobs",
            "AgentJobs by phase and purpose, as the watch sees them",
            labels=["phase", "purpose"],
        )
        for (phase, purpose), n in sorted(Tally(list(self.view.jobs.values())).items()):
            jobs.add_metric([phase, purpose], n)
        yield jobs
        yield GaugeMetricFamily(
            "posttrain_orphaned_jobs",
            "Jobs whose cancellation the backend has not confirmed (listed in Episodes' status.orphanedJobs)",
            value=sum(e.orphans for e in self.view.episodes.values()),
        )

    @staticmethod
    def _rewards(seen: list[EpisodeSeen]) -> Metric:
        family = GaugeHistogramMetricFamily(
            "posttrain_episode_reward",
            "Rewards of the ended Episodes the watch sees, by task (GraderFailed ones have none)",
            labels=["task"],
        )
        by_task: dict[str, list[float]] = {}
        for e in seen:
            if e.reward is not None:
                by_task.setdefault(e.charged_to[1], []).append(e.reward)
        for task, rewards in sorted(by_task.items()):
            buckets = [(str(le) if le != math.inf else "+Inf", sum(1 for r in rewards if r <= le))
                       for le in REWARD_BUCKETS]  # fmt: skip
            family.add_metric([task], buckets, gsum_value=sum(rewards))
        return family

    def _quotas(self) -> Iterator[Metric]:
        for field_, what in (
            ("limit", "The limit"),
            ("reserved", "Reservations"),
            ("settled", "Settled agent spend"),
            ("platform", "Platform spend (graders, overruns)"),
        ):
            family = GaugeMetricFamily(
                f"posttrain_quota_{field_}_microdollars",
                f"{what} of each namespace's BudgetQuota in its current window",
                labels=["namespace"],
            )
            for namespace, seen in sorted(self.view.quotas.items()):
                family.add_metric([namespace], getattr(seen, field_))
            yield family


class _BackendCollector(Collector):
    """The backends' own call counters (kept by every backend for the benchmarks) as metrics."""

    def __init__(self, backends: Callable[[], Mapping[str, CallStats]]) -> None:
        self.backends = backends

    def collect(self) -> Iterator[Metric]:
        requests = CounterMetricFamily(
            "posttrain_backend_requests",
            "Backend API requests by backend, route (API method) and status",
            labels=["backend", "route", "status"],
        )
        retries = CounterMetricFamily(
            "posttrain_backend_retries",
            "Backend API requests retried after a transient failure",
            labels=["backend", "route"],
        )
        waits = CounterMetricFamily(
            "posttrain_backend_rate_limit_waits",
            "Waits a backend's rate limit imposed (HTTP 429)",
            labels=["backend"],
        )
        waited = CounterMetricFamily(
            "posttrain_backend_rate_limit_wait_seconds",
            "Seconds spent waiting on a backend's rate limit",
            labels=["backend"],
        )
        for name, stats in sorted(self.backends().items()):
            for (route, status), n in sorted(stats.outcomes.items()):
                requests.add_metric([name, route, status], n)
            for route, n in sorted(stats.retries.items()):
                retries.add_metric([name, route], n)
            waits.add_metric([name], stats.rate_limit_waits)
            waited.add_metric([name], stats.rate_limit_wait_seconds)
        yield from (requests, retries, waits, waited)


class CollectorPauses(Collector):
    """How often, and for how long, CPython's garbage collector stopped the process, by generation:
    a `gc.callbacks` hook, one per process (`install` is idempotent), collected into every registry."""

    def __init__(self) -> None:
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = [0.0, 0.0, 0.0]
        self._started = 0.0

    def install(self) -> None:
        if self._record not in gc.callbacks:
            gc.callbacks.append(self._record)

    def _record(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        generation, paused = info["generation"], time.perf_counter() - self._started
        self.collections[generation] += 1
        self.seconds[generation] += paused
        self.longest[generation] = max(self.longest[generation], paused)

    def collect(self) -> Iterator[Metric]:
        label = ["generation"]
        collections = CounterMetricFamily("posttrain_gc_collections", "Garbage collections", labels=label)
        seconds = CounterMetricFamily(
            "posttrain_gc_pause_seconds", "Seconds the garbage collector stopped the process", labels=label
        )
        longest = GaugeMetricFamily(
            "posttrain_gc_longest_pause_seconds", "The longest garbage collection so far", labels=label
        )
        for generation in range(3):
            collections.add_metric([str(generation)], self.collections[generation])
            seconds.add_metric([str(generation)], self.seconds[generation])
            longest.add_metric([str(generation)], self.longest[generation])
        yield from (collections, seconds, longest)


COLLECTOR_PAUSES = CollectorPauses()


class OperatorMetrics:
    """Every metric the operator exposes, in its own registry (tests build as many as they like)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.view = WatchView()
        self.registry.register(_ViewCollector(self.view))
        self.registry.register(COLLECTOR_PAUSES)
        # Every metric below is in this registry.
        counter = functools.partial(Counter, registry=self.registry)
        self.reserved = counter(
            "posttrain_reserved_microdollars",
            "Micro-dollars reserved on Episode ledgers at admission, by namespace, task and backend",
            SPEND_LABELS,
        )
        self.settled = counter(
            "posttrain_settled_microdollars",
            "Micro-dollars settled on Episode ledgers, by namespace, task and backend: payer=agent sums "
            "their settledMicroUSD, payer=platform grader jobs and overruns",
            ["payer", *SPEND_LABELS],
        )
        self.rejections = counter(
            "posttrain_agentjob_rejections",
            "AgentJobs refused at admission, by reason (BudgetExceeded, QuotaExceeded, ...) and namespace",
            ["reason", "namespace"],
        )
        self.admission_seconds = Histogram(
            "posttrain_admission_latency_seconds",
            "From an AgentJob's creation to its admission",
            ["purpose"],
            buckets=ADMISSION_BUCKETS,
            registry=self.registry,
        )
        self.reconcile_errors = counter(
            "posttrain_reconcile_errors",
            "Reconciles that failed (and were retried), by kind and error",
            ["kind", "error"],
        )

    def count_settled(self, charged_to: tuple[str, str, str], agent: int, platform: int) -> None:
        """Settled spend, charged to an Episode's namespace, task and backend (`spend_labels`). A label
        set first counted at 0 has both payers, so rate() sees its first charge of either."""
        self.settled.labels("agent", *charged_to).inc(agent)
        self.settled.labels("platform", *charged_to).inc(platform)

    def watch_backends(self, backends: Callable[[], Mapping[str, CallStats]]) -> None:
        self.registry.register(_BackendCollector(backends))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
