"""The operator's /metrics, scraped during a real episode (the API server, the operator process, the
HF emulator): the counters move exactly as the Episode's ledger does, and no name becomes a label."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import Kubectl, wait_for
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    wait_phase,
)

CPU_BASIC_MICRO_PER_MINUTE = 167

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(url: str) -> tuple[str, Samples]:
    response = httpx.get(f"{url}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return response.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def test_metrics_follow_the_ledger_through_an_episode(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    url = operator.metrics_url
    wait_for(lambda: "metrics listening" in operator.current_log(), what="the metrics port", timeout=300)
    _, before = scrape(url)
    # Spend is charged to the Episode's namespace (the team), task and backend.
    team = {"namespace": namespace, "task": "t0_artifact", "backend": "hf-jobs"}
    assert value(before, "posttrain_settled_microdollars_total", payer="agent", **team) == 0

    apply(kubectl, namespace, episode_manifest("metered-ep", budget="0.0018"))
    wait_phase(kubectl, namespace, "episode", "metered-ep", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("metered-job", "metered-ep", timeoutSeconds=600))
    wait_phase(kubectl, namespace, "agentjob", "metered-job", {"Succeeded"})
    # 600 s reserves 10 minutes x $0.000167 = $0.00167; with the first settled at one minute, $0.001633
    # of the $0.0018 is left, so a second 600 s job does not fit.
    apply(kubectl, namespace, agentjob_manifest("metered-big", "metered-ep", timeoutSeconds=600))
    big = wait_phase(kubectl, namespace, "agentjob", "metered-big", {"Rejected"})
    assert big["status"]["reason"] == "BudgetExceeded"
    ledger = wait_for(
        lambda: (led := get(kubectl, namespace, "episode", "metered-ep")["status"]["ledger"])[
            "settledMicroUSD"
        ]
        and led,
        what="the ledger to settle",
    )
    assert ledger["settledMicroUSD"] == CPU_BASIC_MICRO_PER_MINUTE

    def caught_up() -> tuple[str, Samples] | None:
        text, now = scrape(url)
        jobs = {
            ("Succeeded", "train"): value(now, "posttrain_agentjobs", phase="Succeeded", purpose="train"),
            ("Rejected", "train"): value(now, "posttrain_agentjobs", phase="Rejected", purpose="train"),
            # The Episode as its daemon's last tick saw it: settled.
            ("settled", ""): value(now, "posttrain_episode_settled_microdollars", phase="Running", **team)
            / CPU_BASIC_MICRO_PER_MINUTE,
        }
        return (text, now) if set(jobs.values()) == {1.0} else None

    text, after = wait_for(caught_up, what="the watch view to show both jobs and the settled ledger")
    settled = "posttrain_settled_microdollars_total"
    assert value(after, settled, payer="agent", **team) == ledger["settledMicroUSD"]
    assert value(after, settled, payer="platform", **team) == ledger.get("platformMicroUSD", 0)
    assert value(after, "posttrain_reserved_microdollars_total", **team) == 10 * CPU_BASIC_MICRO_PER_MINUTE
    rejected = value(
        after, "posttrain_agentjob_rejections_total", reason="BudgetExceeded", namespace=namespace
    )
    assert rejected == 1
    assert value(after, "posttrain_admission_latency_seconds_count", purpose="train") == 1
    assert value(after, "posttrain_episodes", phase="Running", outcome="None", **team) == 1
    assert value(after, "posttrain_episode_budget_microdollars", phase="Running", **team) == 1800
    assert value(after, "posttrain_orphaned_jobs") == 0
    assert (
        value(after, "posttrain_backend_requests_total", backend="hf-jobs", route="run_job", status="ok") == 1
    )
    assert value(after, "posttrain_reconcile_errors_total") == 0
    # Low cardinality: no episode or job name anywhere in the exposition.
    assert "metered" not in text
