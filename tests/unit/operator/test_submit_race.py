"""`submit` against the episode's end at the same instant: the gateway's tool call (its step, then the
submission) and the operator's pass (a limit reached, then the end) run interleaved over one in-memory
API server, hundreds of times with seeded jitter, for each of the three limits. Every acknowledged
submission is scored; every refused one names the limit that ended the episode; never both.

The in-memory API server keeps the CRD's rule that takes a submission only while the Episode is
Running (tests/integration/operator/test_validation.py proves the rule on the real API server, and
tests/integration/gateway/test_gateway_submit_race.py runs a smaller race there)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from posttrain_operator.api.rules import parse_time
from posttrain_operator.config import OperatorSettings
from posttrain_operator.k8s import Kube as OperatorKube
from posttrain_operator.reconcile.context import Context
from posttrain_operator.reconcile.episode import reconcile_episode

from env_gateway.auth import Authenticator
from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeView
from env_gateway.episodes import Episodes
from env_gateway.kube import Kube as GatewayKube
from tests.unit.operator.fakes import FakeBackend, FakeClock, FakeKubernetes

NS = "ns"
TRIALS = 200
LIMITS = ("steps", "time", "budget")
NAMES_THE_LIMIT = {"steps": "step limit", "time": "wall-time limit", "budget": "budget exhausted"}


class Jittery:
    """The in-memory API server, each call yielding to the event loop a seeded number of times first,
    so the gateway's and the operator's requests interleave differently in every trial."""

    def __init__(self, api: FakeKubernetes, rng: random.Random) -> None:
        self._api = api
        self._rng = rng

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._api, name)
        if not name.endswith("_custom_object") and "custom_object_" not in name:
            return target

        async def call(*args: Any, **kwargs: Any) -> Any:
            for _ in range(self._rng.randrange(6)):
                await asyncio.sleep(0)
            return await target(*args, **kwargs)

        return call


def world(rng: random.Random, limit: str, tmp: Path) -> tuple[FakeKubernetes, FakeClock, Context, Episodes]:
    api, clock = FakeKubernetes(), FakeClock()
    jittery: Any = Jittery(api, rng)
    settings = OperatorSettings(hf_http_timeout_seconds=30)
    backends: dict[str, Any] = {"hf-jobs": FakeBackend()}
    ctx = Context(kube=OperatorKube(jittery, api, api), backends=backends, settings=settings, clock=clock)
    gateway_settings = GatewaySettings(
        namespace=NS,
        orchestrator_token="o" * 24,
        broker_token_file=str(tmp / "token"),  # type: ignore[arg-type]
    )
    kube = GatewayKube(SimpleNamespace())  # type: ignore[arg-type]
    kube.custom = jittery
    episodes = Episodes(
        gateway_settings, kube, BrokerClient("http://127.0.0.1:9", str(tmp / "token")),
        Authenticator(gateway_settings, kube), clock=clock,
    )  # fmt: skip
    max_steps = 5
    spec = {"task": "t0_artifact", "budgetUSD": "1.00", "backend": "hf-jobs", "agentTokenHash": "0" * 64,
            "limits": {"maxSteps": max_steps}}  # fmt: skip
    api.put("episodes", NS, {"apiVersion": "posttrain.dev/v1alpha1", "kind": "Episode",
                             "metadata": {"name": "ep"}, "spec": spec})  # fmt: skip
    api.put("agentjobs", NS, {"apiVersion": "posttrain.dev/v1alpha1", "kind": "AgentJob",
                              "metadata": {"name": "j1"},
                              "spec": {"episode": "ep", "purpose": "train", "script": "print(1)",
                                       "flavor": "cpu-basic", "timeoutSeconds": 600}})  # fmt: skip
    api.objects["agentjobs", NS, "j1"]["status"] = {"phase": "Succeeded"}
    return api, clock, ctx, episodes


def bring_to_the_edge(api: FakeKubernetes, clock: FakeClock, limit: str) -> None:
    """The started Episode one step, one second or one job's price from its limit."""
    status = api.objects["episodes", NS, "ep"]["status"]
    if limit == "steps":
        status["steps"] = 4  # the submit call takes the fifth and last
    elif limit == "time":
        deadline = parse_time(status["deadline"])
        assert deadline is not None
        clock.now = deadline - timedelta(seconds=1)
    else:  # spent all but less than a minute of the cheapest flavor
        ledger = status["ledger"]
        ledger["settledMicroUSD"] = ledger["budgetMicroUSD"] - 100
        ledger["entries"] = {"j1": {"reservedMicroUSD": ledger["budgetMicroUSD"] - 100,
                                    "settledMicroUSD": ledger["budgetMicroUSD"] - 100}}  # fmt: skip


async def trial(seed: int, limit: str, tmp: Path) -> str:
    rng = random.Random(seed)
    api, clock, ctx, episodes = world(rng, limit, tmp)
    await reconcile_episode(ctx, NS, "ep")
    bring_to_the_edge(api, clock, limit)
    view = EpisodeView.parse(api.obj("episodes", NS, "ep"))

    async def operator_pass() -> None:
        for _ in range(rng.randrange(8)):
            await asyncio.sleep(0)
        if limit == "time":
            clock.advance(1)  # the deadline passes as the two race
        await reconcile_episode(ctx, NS, "ep")

    steps: list[Callable[[], Awaitable[Any]]] = [
        lambda: episodes.call_tool(view, "submit", {"job": "j1"}),
        operator_pass,
    ]
    outcome, _ = await asyncio.gather(*(step() for step in steps))
    await reconcile_episode(ctx, NS, "ep")  # the operator's next pass: scoring starts, or nothing

    episode = api.obj("episodes", NS, "ep")
    status, submission = episode["status"], episode["spec"].get("submission")
    if outcome.error is None:
        assert submission == {"checkpointFrom": "j1"}, (seed, limit, status)
        assert status["phase"] == "Scoring", (seed, limit, status)  # it is being scored
        assert status.get("outcome") is None, (seed, limit, status)
        return "acknowledged"
    error = outcome.error
    assert submission is None, (seed, limit, error.code, status)
    assert (status["phase"], status["outcome"], status["reward"]) == ("Completed", "LimitReached", "0")
    assert NAMES_THE_LIMIT[limit] in error.message, (seed, limit, error.code, error.message)
    assert outcome.done and outcome.reward == 0.0, (seed, limit, outcome)
    return "refused"


@pytest.mark.parametrize("limit", LIMITS)
async def test_submit_racing_the_episodes_end_is_either_scored_or_refused_naming_the_limit(
    limit: str, tmp_path: Path
) -> None:
    (tmp_path / "token").write_text("unused")
    verdicts = [await trial(seed, limit, tmp_path) for seed in range(TRIALS)]
    # Both orders happened: the race is exercised, not one side always first.
    assert verdicts.count("acknowledged") > 0 and verdicts.count("refused") > 0, verdicts.count("refused")
