"""`submit` as an episode's last step, against the real API server and a real operator: the call that
takes the last step races the operator ending the episode at its step limit. Whichever wins, the
contract holds: an acknowledged submission goes to scoring, a refused one names the step limit, never
both. A smaller run of the unit tier's race (tests/unit/operator/test_submit_race.py), in parallel."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from tests.helpers import Kubectl
from tests.integration.gateway.agent_steps import finished, result
from tests.integration.gateway.support import GatewayServer, orchestrator
from tests.integration.support import get

EPISODES = 8
MAX_STEPS = 8
# The most a loaded machine may take for the operator to end an episode (a state is awaited).
END_WITHIN_SECONDS = 120


async def submit_at_the_last_step(gateway: GatewayServer) -> tuple[str, dict[str, Any]]:
    """(episode, the submit step's observation), submit taking the episode's last step."""
    async with orchestrator(gateway) as orch:
        reset = await orch.reset(task="t0_artifact", budget_usd="0.05", max_steps=MAX_STEPS)
        episode = reset["observation"]["episode"]
        job = result(await orch.call("jobs_submit", script="print(1)", timeout_seconds=60))["job"]["name"]
        assert (await finished(orch, job))["phase"] == "Succeeded"
        step = await orch.call("task_info")
        while step["metadata"]["steps_left"] > 1:
            step = await orch.call("task_info")
        return episode, (await orch.call("submit", job=job))


async def ended(gateway: GatewayServer, kubectl: Kubectl, episode: str) -> dict[str, Any]:
    async with asyncio.timeout(END_WITHIN_SECONDS):
        while True:
            body = await asyncio.to_thread(get, kubectl, gateway.namespace, "episode", episode)
            if (body.get("status") or {}).get("phase") in ("Completed", "Failed"):
                return body
            await asyncio.sleep(0.5)


async def test_submit_as_the_last_step_is_either_scored_or_refused_naming_the_step_limit(
    gateway: GatewayServer, kubectl: Kubectl
) -> None:
    races = await asyncio.gather(*(submit_at_the_last_step(gateway) for _ in range(EPISODES)))
    verdicts: Counter[str] = Counter()
    for episode, step in races:
        body = await ended(gateway, kubectl, episode)
        status, submission = body["status"], body["spec"].get("submission")
        error = step["observation"]["error"]
        if error is None:  # acknowledged: scored (the emulated job wrote no checkpoint: 0, or GraderFailed)
            assert submission is not None, (episode, status)
            assert status["outcome"] in ("Scored", "GraderFailed"), (episode, status)
            verdicts["acknowledged"] += 1
        else:
            assert submission is None, (episode, error, status)
            assert status["outcome"] == "LimitReached", (episode, status)
            assert "step limit" in error["message"], (episode, error)
            assert step["done"] and step["reward"] == 0.0, (episode, step)
            verdicts["refused"] += 1
    print(f"submit as the last step, {EPISODES} episodes: {dict(verdicts)}")
