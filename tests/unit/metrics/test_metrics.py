"""The metrics' pure parts: the watch view's gauges, the backend counters, the refusal reasons, and
that no episode or job name ever becomes a label."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from posttrain_operator.backends.base import CallStats, status_label
from posttrain_operator.metrics import OperatorMetrics, QuotaSeen
from prometheus_client.parser import text_string_to_metric_families

from env_gateway.metrics import GatewayMetrics

pytestmark = pytest.mark.unit


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text.decode())
        for s in family.samples
    }


def episode(
    name: str,
    phase: str | None,
    outcome: str | None = None,
    orphans: int = 0,
    *,
    namespace: str = "ns",
    task: str = "t0",
    backend: str = "hf-jobs",
) -> dict[str, Any]:
    status: dict[str, Any] = {"orphanedJobs": [{"name": f"j{i}"} for i in range(orphans)]}
    if phase:
        status["phase"] = phase
    if outcome:
        status["outcome"] = outcome
    meta = {"namespace": namespace, "name": name}
    return {"metadata": meta, "spec": {"task": task, "backend": backend}, "status": status}


def labels(**given: str) -> tuple[tuple[str, str], ...]:
    """A sample's labels as `samples` keys them; an Episode's spend labels default to episode()'s."""
    return tuple(sorted(({"namespace": "ns", "task": "t0", "backend": "hf-jobs"} | given).items()))


def job(name: str, phase: str, purpose: str) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": name},
        "spec": {"purpose": purpose},
        "status": {"phase": phase},
    }


def test_watch_view_counts_by_phase_and_outcome_and_forgets_deleted_objects() -> None:
    m = OperatorMetrics()
    m.view.observe_episode(episode("secret-episode-a", "Running"))
    m.view.observe_episode(episode("b", "Completed", "Scored"))
    m.view.observe_episode(episode("c", "Completed", "Scored", orphans=2))
    m.view.observe_episode(episode("d", None))
    m.view.observe_job(job("secret-job-1", "Running", "train"))
    m.view.observe_job(job("j2", "Running", "train"))
    m.view.observe_job(job("j3", "Rejected", "devEval"))
    m.view.observe_job(job("j2", "Succeeded", "train"))  # a later event replaces the earlier one
    m.view.observe_episode(episode("a2", "Running"))
    m.view.observe_episode(episode("a2", "Running"), deleted=True)

    text = m.exposition()
    got = samples(text)
    assert got[("posttrain_episodes", labels(outcome="None", phase="Running"))] == 1
    assert got[("posttrain_episodes", labels(outcome="Scored", phase="Completed"))] == 2
    assert got[("posttrain_episodes", labels(outcome="None", phase="Pending"))] == 1
    assert got[("posttrain_agentjobs", (("phase", "Running"), ("purpose", "train")))] == 1
    assert got[("posttrain_agentjobs", (("phase", "Succeeded"), ("purpose", "train")))] == 1
    assert got[("posttrain_agentjobs", (("phase", "Rejected"), ("purpose", "devEval")))] == 1
    assert got[("posttrain_orphaned_jobs", ())] == 2
    assert b"secret" not in text


def test_backend_counters_come_from_the_backends_call_stats() -> None:
    stats = CallStats()
    stats.count("run_job")
    stats.ended("run_job", "ok")
    stats.ended("inspect_job", "429")
    stats.retried("inspect_job", rate_limited_for=2.5)
    stats.retried("inspect_job")
    m = OperatorMetrics()
    m.watch_backends(lambda: {"hf-jobs": stats})

    got = samples(m.exposition())
    route = (("backend", "hf-jobs"), ("route", "inspect_job"))
    assert (
        got[("posttrain_backend_requests_total", (*route[:1], ("route", "run_job"), ("status", "ok")))] == 1
    )
    assert got[("posttrain_backend_requests_total", (*route, ("status", "429")))] == 1
    assert got[("posttrain_backend_retries_total", route)] == 2
    assert got[("posttrain_backend_rate_limit_waits_total", (("backend", "hf-jobs"),))] == 1
    assert got[("posttrain_backend_rate_limit_wait_seconds_total", (("backend", "hf-jobs"),))] == 2.5


class _HttpError(Exception):
    def __init__(self, code: int) -> None:
        self.response = type("R", (), {"status_code": code})()


@pytest.mark.parametrize(
    ("exc", "want"),
    [
        (_HttpError(503), "503"),
        (TimeoutError(), "timeout"),
        (ValueError("x"), "error"),
        (_HttpError(7), "error"),
    ],
    ids=["http status", "timeout", "other error", "not an http status"],
)
def test_status_label_is_bounded(exc: Exception, want: str) -> None:
    assert status_label(exc) == want


def test_gateway_counts_refusals_by_reason_and_bounds_tool_names() -> None:
    m = GatewayMetrics(frozenset({"jobs_submit"}))
    m.called("jobs_submit", None, 0.1)
    m.called("jobs_submit", "budget_exceeded", 0.1)
    m.called("jobs_submit", "step_limit_reached", 0.1)
    m.called("made_up_tool_of_an_attacker", "unknown_tool", 0.1)
    m.refused_auth()

    got = samples(m.exposition())
    assert got[("posttrain_gateway_tool_calls_total", (("result", "ok"), ("tool", "jobs_submit")))] == 1
    assert got[("posttrain_gateway_tool_calls_total", (("result", "unknown_tool"), ("tool", "unknown")))] == 1
    for reason, n in {"budget": 1, "step_limit": 1, "validation": 1, "auth": 1, "time_limit": 0}.items():
        assert got[("posttrain_gateway_refusals_total", (("reason", reason),))] == n
    assert not any("made_up" in str(key) for key in got)


def test_watch_view_sums_ledgers_by_phase_and_bins_rewards() -> None:
    m = OperatorMetrics()
    for name, phase, reward, settled in (("a", "Completed", "1", 300), ("b", "Completed", "0.25", 100),
                                         ("c", "Running", None, 50)):  # fmt: skip
        body = episode(name, phase, "Scored" if reward else None)
        body["status"]["ledger"] = {"budgetMicroUSD": 1000, "settledMicroUSD": settled, "reservedMicroUSD": 7}
        if reward:
            body["status"]["reward"] = reward
        m.view.observe_episode(body)

    got = samples(m.exposition())
    assert got[("posttrain_episode_budget_microdollars", labels(phase="Completed"))] == 2000
    assert got[("posttrain_episode_settled_microdollars", labels(phase="Completed"))] == 400
    assert got[("posttrain_episode_reserved_microdollars", labels(phase="Running"))] == 7
    assert got[("posttrain_episode_reward_bucket", (("le", "0.2"), ("task", "t0")))] == 0
    assert got[("posttrain_episode_reward_bucket", (("le", "0.3"), ("task", "t0")))] == 1
    assert got[("posttrain_episode_reward_bucket", (("le", "1.0"), ("task", "t0")))] == 2
    assert got[("posttrain_episode_reward_gcount", (("task", "t0"),))] == 2


def test_spend_is_charged_to_namespace_task_and_backend_and_series_stay_bounded_by_them() -> None:
    """1,000 episodes across 4 namespaces, 2 tasks and 2 backends, each admitting, settling and being
    refused: the series are those of the label sets, not of the episodes (100 episodes give as many)."""
    teams, tasks, backends = (
        ["team-a", "team-b", "team-c", "team-d"],
        ["gsm8k", "arithmetic"],
        ["hf-jobs", "pods"],
    )

    def run(episodes: int) -> tuple[dict[Any, float], int]:
        m = OperatorMetrics()
        for i in range(episodes):
            ns, task, backend = teams[i % 4], tasks[i // 4 % 2], backends[i // 8 % 2]
            phase, outcome = ("Completed", "Scored") if i % 3 else ("Running", None)
            body = episode(f"ep-{i}", phase, outcome, namespace=ns, task=task, backend=backend)
            body["status"]["ledger"] = {"budgetMicroUSD": 10, "settledMicroUSD": i, "reservedMicroUSD": 1}
            if outcome:
                body["status"]["reward"] = str(i % 10 / 10)
            m.view.observe_episode(body)
            m.view.observe_job(job(f"ep-{i}-job", "Succeeded", "train"))
            m.reserved.labels(ns, task, backend).inc(100)
            m.count_settled((ns, task, backend), i, 1)
            m.rejections.labels("QuotaExceeded", ns).inc()
        for ns in teams:
            m.view.observe_quota(ns, QuotaSeen(limit=1000, reserved=1, settled=2, platform=3))
        got = samples(m.exposition())
        return got, len(got)

    got, series = run(1000)
    _, series_at_100 = run(100)
    assert series == series_at_100
    # No family has more samples than 2 (phases, or payers) for each of the 16 (namespace, task,
    # backend) label sets; the reward histogram has 12 buckets per task.
    per_family = Counter(k[0] for k in got)
    assert max(per_family.values()) == 2 * 16 and per_family["posttrain_episode_reward_bucket"] == 12 * 2
    assert not any(k[1] and any(v.startswith("ep-") for _, v in k[1]) for k in got)
    settled = {k: v for k, v in got.items() if k[0] == "posttrain_settled_microdollars_total"}
    assert len(settled) == 2 * 16
    want_a = sum(i for i in range(1000) if i % 4 == 0 and i // 4 % 2 == 0 and i // 8 % 2 == 0)
    key = ("posttrain_settled_microdollars_total", labels(payer="agent", namespace="team-a", task="gsm8k"))
    assert got[key] == want_a
    assert sum(v for k, v in got.items() if k[0] == "posttrain_quota_limit_microdollars") == 4000
    assert {dict(k[1])["task"] for k in got if k[0] == "posttrain_episode_reward_gcount"} == set(tasks)
