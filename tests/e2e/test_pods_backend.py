"""The pods backend on the kind cluster: episodes whose training, `dev_evaluate` and score jobs run as
hardened pods of the launcher image in the episode's own namespace, with the hostPath artifact store
the chart configures, spend settled from the pods' run time at the flavor's price."""

from __future__ import annotations

import asyncio
import sys
from typing import Any

import pytest
from posttrain_operator.api.rules import parse_time
from posttrain_operator.ledger import billed_seconds, cost_for

from tests.e2e.conftest import GATEWAY_SERVICE, POD_FLAVORS, REPO, Release, port_forward, say

sys.path.insert(0, str(REPO / "examples"))
import scripted_sft_agent

pytestmark = pytest.mark.timeout(2400)

PRICE = int(POD_FLAVORS["cpu-basic"]["priceMicroUSDPerMinute"])


@pytest.fixture
def pods_release(release: Release) -> Release:
    if not release.cluster.is_kind:
        pytest.skip("the pods backend is enabled on the kind cluster only (its store is a hostPath)")
    return release


def _play(request: pytest.FixtureRequest, release: Release, task: str) -> scripted_sft_agent.EpisodeResult:
    with port_forward(release, f"svc/{GATEWAY_SERVICE}", 80) as gateway:
        result = asyncio.run(
            scripted_sft_agent.run_episode(
                gateway, release.orchestrator_token, task, say=lambda _: None, backend="pods"
            )
        )
    say(
        request.config,
        f"\n[pods] {result.task:22} {result.outcome:8} reward {result.reward or 'null':>6} "
        f"dev {result.dev_score or '-':>5} spend ${result.spend_usd} wall {result.wall_seconds}s",
    )
    return result


def _assert_settled_from_pod_run_time(release: Release, episode: str) -> dict[str, Any]:
    """Every job ran as a pod of the episode's namespace; the Episode paid, for each agent job, its
    container's run time (started to finished, per started minute) at the flavor's price."""
    status: dict[str, Any] = release.json("get", "episode", episode)["status"]
    ledger = status["ledger"]
    assert ledger["reservedMicroUSD"] == 0, ledger
    jobs = [j for j in release.json("get", "agentjobs")["items"] if j["spec"]["episode"] == episode]
    assert {j["spec"]["purpose"] for j in jobs} == {"train", "devEval", "score"}, jobs
    expected = 0
    for job in jobs:
        st = job["status"]
        assert st["phase"] == "Succeeded", st
        assert st["backend"] == "pods" and "/" in st["backendJobId"], st
        seconds = billed_seconds(parse_time(st["startedAt"]), parse_time(st["finishedAt"]))
        assert st["billedSeconds"] == seconds > 0, st
        if job["spec"]["purpose"] != "score":
            expected += cost_for(PRICE, seconds)
    assert ledger["settledMicroUSD"] == expected, (ledger, [j["status"] for j in jobs])
    return status


def test_t0_artifact_on_pods(request: pytest.FixtureRequest, pods_release: Release) -> None:
    result = _play(request, pods_release, "t0_artifact")
    assert (result.outcome, result.reward) == ("Scored", "1"), result
    status = _assert_settled_from_pod_run_time(pods_release, result.episode)
    assert status["phase"] == "Completed" and status["reward"] == "1"


def test_t0_arithmetic_format_on_pods(request: pytest.FixtureRequest, pods_release: Release) -> None:
    result = _play(request, pods_release, "t0_arithmetic_format")
    assert result.outcome == "Scored" and result.reward is not None, result
    assert float(result.reward) >= 0.9, result
    _assert_settled_from_pod_run_time(pods_release, result.episode)
