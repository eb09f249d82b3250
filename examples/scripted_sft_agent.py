"""A scripted agent: drives one episode through the gateway's tools, as an LLM agent would.

The orchestrator side resets an episode over OpenEnv `/ws` (and receives the agent's token); the agent
side uses the official MCP client: submit one training job, check it with `dev_evaluate`, `submit`
it, and wait for the hidden-split reward.

    python examples/scripted_sft_agent.py --gateway http://127.0.0.1:PORT --orchestrator-token T \
        --task t0_arithmetic_format
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx2
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

EXAMPLES = Path(__file__).resolve().parent
# A reset waits for the operator to start the episode (the gateway's own wait, then its answer): on a
# loaded machine, or while an operator restarts, that can take minutes.
RESET_REPLY_TIMEOUT_SECONDS = 300
SOLUTIONS = {
    "t0_artifact": (EXAMPLES / "t0_artifact_solution.py", 300),
    "t0_arithmetic_format": (EXAMPLES / "train_arithmetic_sft.py", 1800),
    "gsm8k": (EXAMPLES / "train_gsm8k_sft.py", 3600),
}


@dataclass
class EpisodeResult:
    task: str
    episode: str
    reward: str | None
    reward_interval: list[str] | None
    outcome: str
    integrity: str | None  # the reward's label: clean, flagged or violation
    dev_score: str | None
    spend_usd: str
    jobs: int
    wall_seconds: float


class ToolError(RuntimeError):
    pass


async def reset_episode(
    gateway: str, orchestrator_token: str, task: str, backend: str | None = None, **extra: Any
) -> dict[str, Any]:
    """The orchestrator's side: an OpenEnv `reset` over `/ws`; the observation carries the agent token."""
    ws_url = gateway.replace("http://", "ws://").replace("https://", "wss://") + "/ws"
    headers = {"Authorization": f"Bearer {orchestrator_token}"}
    async with websockets.connect(ws_url, additional_headers=headers) as conn:
        data = {"task": task} | ({"backend": backend} if backend else {}) | extra
        await conn.send(json.dumps({"type": "reset", "data": data}))
        reply = json.loads(await asyncio.wait_for(conn.recv(), RESET_REPLY_TIMEOUT_SECONDS))
    if reply.get("type") != "observation":
        raise ToolError(f"reset failed: {reply}")
    observation: dict[str, Any] = reply["data"]["observation"]
    return observation


_last_spend: dict[str, str] = {}


@contextlib.asynccontextmanager
async def agent_client(gateway: str, token: str) -> AsyncIterator[Client]:
    """The official MCP client on the gateway's `/mcp`, authenticated by the agent token."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as http,
        Client(streamable_http_client(f"{gateway}/mcp", http_client=http)) as client,
    ):
        yield client


async def call_tool(session: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """One tool call; its structured result, or ToolError when the gateway refused it."""
    result = await session.call_tool(tool, arguments)
    if result.is_error or not isinstance(result.structured_content, dict):
        raise ToolError(f"{tool} failed: {result.structured_content or result.content}")
    # Every observation reports spend; keep the latest.
    _last_spend.update(((result.meta or {}).get("metadata") or {}).get("service_spend") or {})
    return result.structured_content


async def _wait(session: Client, say: Callable[[str], None], job: str | None = None) -> dict[str, Any]:
    """Call jobs_wait (each call bounded by the gateway) until the job, or the episode, is finished."""
    started = time.monotonic()
    while True:
        waited = await call_tool(session, "jobs_wait", **({"job": job} if job else {}), timeout_seconds=20)
        if waited["finished"]:
            return waited
        what = waited.get("job", {}).get("phase", "running") if job else "scoring"
        say(f"  ... {job or 'episode'} {what} ({time.monotonic() - started:.0f}s)")


async def run_episode(
    gateway: str,
    orchestrator_token: str,
    task: str,
    say: Callable[[str], None] = print,
    backend: str | None = None,
) -> EpisodeResult:
    started = time.monotonic()
    script_path, timeout = SOLUTIONS[task]
    observation = await reset_episode(gateway, orchestrator_token, task, backend)
    token = observation["metadata"]["agent_token"]
    episode = observation["episode"]
    say(f"[{task}] episode {episode} started")
    async with agent_client(gateway, token) as session:
        await call_tool(session, "task_info")
        submitted = await call_tool(
            session, "jobs_submit", script=script_path.read_text(), timeout_seconds=timeout
        )
        job = submitted["job"]["name"]
        say(f"[{task}] training job {job} {submitted['job']['phase']}")
        trained = await _wait(session, say, job)
        if trained["job"]["phase"] != "Succeeded":
            raise ToolError(f"training job ended {trained['job']['phase']}: {trained['job'].get('message')}")
        dev = await call_tool(session, "dev_evaluate", job=job)
        evaluated = await _wait(session, say, dev["job"]["name"])
        dev_score = (evaluated["job"].get("result") or {}).get("score")
        say(f"[{task}] dev score {dev_score}; submitting {job}")
        await call_tool(session, "submit", job=job)
        final = await _wait(session, say)
    return EpisodeResult(
        task=task,
        episode=episode,
        reward=final.get("reward"),
        reward_interval=final.get("reward_interval"),
        outcome=final.get("outcome", "?"),
        integrity=final.get("integrity"),
        dev_score=dev_score,
        spend_usd=_last_spend.get("settled_usd", "?"),
        jobs=3,  # train, devEval, and the hidden-split grader the operator runs
        wall_seconds=round(time.monotonic() - started, 1),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--gateway", required=True)
    parser.add_argument("--orchestrator-token", required=True)
    parser.add_argument("--task", choices=sorted(SOLUTIONS), default="t0_artifact")
    parser.add_argument("--backend", choices=["hf-jobs", "pods"], help="default: the gateway's")
    args = parser.parse_args(argv)
    result = asyncio.run(run_episode(args.gateway, args.orchestrator_token, args.task, backend=args.backend))
    print(json.dumps(asdict(result)))
    return 0 if result.outcome == "Scored" else 1


if __name__ == "__main__":
    sys.exit(main())
