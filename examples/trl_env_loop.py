"""A TRL-style environment loop: many episodes played in parallel over OpenEnv, a reward per rollout.

This is the orchestrator's side only, as a trainer sees it: one OpenEnv `/ws` connection per rollout
(TRL's `environment_factory` makes one environment per generation), `reset` to start an episode, then
`step` with `call_tool` actions until the observation says `done`, whose `reward` is the rollout's. The
policy here is the task's scripted solution (where a trainer's model would generate the actions);
a reward of `null` means the platform failed to grade, and is left out of the mean, as TRL does with a
`None` reward.

    python examples/trl_env_loop.py --rollouts 8          # against the stack `make up` started
    python examples/trl_env_loop.py --gateway URL --orchestrator-token T --rollouts 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import AsyncIterator, Generator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import websockets
from llm_agent import add_gateway_arguments
from scripted_sft_agent import SOLUTIONS

# A reset waits for the operator to start the episode; on a loaded machine that can take minutes.
REPLY_TIMEOUT_SECONDS = 300


@dataclass
class StepResult:
    """One OpenEnv observation envelope (reset and step replies)."""

    observation: dict[str, Any]
    reward: float | None
    done: bool
    metadata: dict[str, Any]

    @classmethod
    def of(cls, sent: dict[str, Any], reply: dict[str, Any]) -> StepResult:
        """The reply to `sent`, which must be an observation."""
        if reply.get("type") != "observation":
            raise RuntimeError(f"{sent['type']} failed: {reply}")
        body = reply["data"]
        metadata = body.get("metadata") or {}
        return cls(body["observation"], body.get("reward"), bool(body.get("done")), metadata)

    def data(self) -> dict[str, Any]:
        """The tool's result, or ToolCallFailed when the gateway refused the call."""
        if self.observation.get("error"):
            raise ToolCallFailed(f"{self.observation.get('tool_name')}: {self.observation['error']}")
        result: dict[str, Any] = (self.observation.get("result") or {}).get("data") or {}
        return result


class ToolCallFailed(RuntimeError):
    pass


class OpenEnvSession:
    """The OpenEnv WS protocol: one reply per frame, paired by order."""

    def __init__(self, conn: websockets.ClientConnection) -> None:
        self.conn = conn

    async def _send(self, message: dict[str, Any]) -> StepResult:
        await self.conn.send(json.dumps(message))
        reply = json.loads(await asyncio.wait_for(self.conn.recv(), REPLY_TIMEOUT_SECONDS))
        return StepResult.of(message, reply)

    async def reset(self, **kwargs: Any) -> StepResult:
        return await self._send({"type": "reset", "data": kwargs})

    async def step(self, action: dict[str, Any]) -> StepResult:
        return await self._send({"type": "step", "data": action})


@asynccontextmanager
async def connect(gateway: str, orchestrator_token: str) -> AsyncIterator[OpenEnvSession]:
    url = gateway.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
    headers = {"Authorization": f"Bearer {orchestrator_token}"}
    async with websockets.connect(url, additional_headers=headers) as conn:
        yield OpenEnvSession(conn)
        await conn.send(json.dumps({"type": "close"}))


def call_tool(tool: str, **arguments: Any) -> dict[str, Any]:
    return {"type": "call_tool", "tool_name": tool, "arguments": arguments}


Policy = Generator[dict[str, Any], StepResult, None]


def scripted_policy(task: str) -> Policy:
    """The task's scripted solution as a policy: it yields actions and is sent each action's result."""
    script, timeout = SOLUTIONS[task]
    submitted = yield call_tool("jobs_submit", script=script.read_text(), timeout_seconds=timeout)
    job = submitted.data()["job"]["name"]
    trained = yield from _wait(job)
    if trained["job"]["phase"] != "Succeeded":
        raise ToolCallFailed(f"training job {job} ended {trained['job']['phase']}")
    evaluated = yield call_tool("dev_evaluate", job=job)
    yield from _wait(evaluated.data()["job"]["name"])
    yield call_tool("submit", job=job)
    while True:  # the episode's end comes as the observation with done (and the reward)
        yield call_tool("jobs_wait", timeout_seconds=20)


def _wait(job: str) -> Generator[dict[str, Any], StepResult, dict[str, Any]]:
    while True:
        waited = (yield call_tool("jobs_wait", job=job, timeout_seconds=20)).data()
        if waited["finished"]:
            return waited


@dataclass
class Rollout:
    index: int
    episode: str
    reward: float | None
    spend_usd: str
    steps: int
    wall_seconds: float


async def rollout(gateway: str, orchestrator_token: str, task: str, index: int) -> Rollout:
    """One episode, start to reward. The gateway's step limit ends it (done, reward 0) whatever the
    policy does, so the loop always terminates."""
    started = time.monotonic()
    async with connect(gateway, orchestrator_token) as env:
        result = await env.reset(task=task)
        episode = result.observation["episode"]
        policy = scripted_policy(task)
        action = next(policy)
        steps = 0
        while not result.done:
            result = await env.step(action)
            steps += 1
            if not result.done:
                action = policy.send(result)
    spend = result.metadata.get("service_spend") or {}
    return Rollout(index, episode, result.reward, spend.get("settled_usd", "?"), steps,
                   round(time.monotonic() - started, 1))  # fmt: skip


async def collect(gateway: str, orchestrator_token: str, task: str, rollouts: int) -> list[Rollout]:
    """Every rollout at once, as a trainer collects a generation batch."""
    return list(
        await asyncio.gather(*(rollout(gateway, orchestrator_token, task, i) for i in range(rollouts)))
    )


def mean_reward(results: list[Rollout]) -> float:
    rewards = [r.reward for r in results if r.reward is not None]
    return sum(rewards) / len(rewards) if rewards else math.nan


def print_table(results: list[Rollout]) -> None:
    print(f"{'rollout':>7}  {'episode':24} {'reward':>6} {'spend $':>10} {'steps':>5} {'wall s':>7}")
    for r in results:
        reward = "null" if r.reward is None else f"{r.reward:g}"
        print(f"{r.index:>7}  {r.episode:24} {reward:>6} {r.spend_usd:>10} {r.steps:>5} {r.wall_seconds:>7}")
    graded = sum(r.reward is not None for r in results)
    print(f"mean reward {mean_reward(results):.3f} over {graded} of {len(results)} rollouts")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gateway_arguments(parser)
    parser.add_argument("--task", choices=sorted(SOLUTIONS), default="t0_artifact")
    parser.add_argument("--rollouts", type=int, default=4)
    args = parser.parse_args(argv)
    results = asyncio.run(collect(args.gateway, args.orchestrator_token, args.task, args.rollouts))
    print_table(results)
    return 0 if all(r.reward is not None for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
