"""An LLM agent driver: any OpenAI-compatible chat-completions endpoint with tool calling plays one
episode through the gateway's MCP tools.

The orchestrator side resets an episode over OpenEnv `/ws` (as the scripted agent does); the agent side
offers the model the episode's MCP tools (`list_tools`, as chat `tools` of type function), forwards each
of its `tool_calls` to MCP `call_tool`, and answers it with a `tool` message holding the observation
and the episode's `service_spend`. It stops when the episode has ended (the reward is known), when the
model answers without a tool call, or when a budget is spent: tool calls, chat turns, or tokens (the sum
of the endpoint's `usage.total_tokens`; an endpoint that reports no usage spends none).

Environment:
    OPENAI_BASE_URL   the endpoint up to and including its version, e.g. http://127.0.0.1:8000/v1
                      (default https://api.openai.com/v1)
    OPENAI_MODEL      the model name the endpoint serves (required)
    OPENAI_API_KEY    sent as a bearer token; may be empty for local servers

    OPENAI_MODEL=... python examples/llm_agent.py --task t0_artifact --max-tool-calls 40

`--gateway` and `--orchestrator-token` default to the stack `make up` started. The last line printed
is a JSON summary of the run; the exit code is 0 when the episode ended scored.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx
from mcp import Client, types
from scripted_sft_agent import agent_client, reset_episode

SYSTEM_PROMPT = """\
You are an ML engineer in a post-training episode. You improve a pinned base model by submitting \
Python training scripts as batch jobs with the tools you are given; each job is charged against the \
episode's dollar budget, and every tool result reports what has been spent (service_spend). Jobs have \
no network. Read the task with task_info, train with jobs_submit, follow a job with jobs_wait (each call \
waits at most 25 s; call it again until `finished` is true), check a checkpoint with dev_evaluate, then \
call submit with the train job whose outputs are your final checkpoint, and call jobs_wait without a \
job until the episode is finished: your reward is the hidden-split score of that checkpoint."""


class ChatEndpointError(RuntimeError):
    """The chat endpoint refused a request or answered something that is not a chat completion."""


@dataclass(frozen=True)
class Budget:
    """What one run may use; the first one spent ends it."""

    max_tool_calls: int = 60
    max_turns: int = 60
    max_tokens: int = 500_000

    def spent(self, run: AgentRun) -> str:
        """Which budget `run` has used up ("" while none is)."""
        if run.tool_calls >= self.max_tool_calls:
            return "tool_call_budget"
        if run.turns >= self.max_turns:
            return "turn_budget"
        if run.tokens >= self.max_tokens:
            return "token_budget"
        return ""


@dataclass
class AgentRun:
    episode: str
    stop_reason: str  # finished | model_stopped | tool_call_budget | turn_budget | token_budget
    done: bool = False
    reward: str | None = None  # the Episode's decimal reward, once it has ended
    outcome: str | None = None
    tool_calls: int = 0
    turns: int = 0
    tokens: int = 0
    service_spend: dict[str, Any] = field(default_factory=dict)
    wall_seconds: float = 0.0


def chat_tools(tools: list[types.Tool]) -> list[dict[str, Any]]:
    """MCP tool descriptors as the chat API's `tools`: one function per tool, its input schema as
    the function's parameters."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description or "",
                "parameters": tool.input_schema or {"type": "object", "properties": {}},
            },
        }
        for tool in tools
    ]


class ChatEndpoint:
    """The chat-completions API of an OpenAI-compatible server, over httpx."""

    def __init__(self, base_url: str, model: str, api_key: str = "", timeout: float = 300.0) -> None:
        self.model = model
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = httpx.AsyncClient(base_url=base_url.rstrip("/"), headers=headers, timeout=timeout)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ChatEndpoint:
        model = env.get("OPENAI_MODEL")
        if not model:
            raise ChatEndpointError("set OPENAI_MODEL to the model the endpoint serves")
        base_url = env.get("OPENAI_BASE_URL") or "https://api.openai.com/v1"
        return cls(base_url, model, env.get("OPENAI_API_KEY", ""))

    async def complete(
        self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]
    ) -> tuple[dict[str, Any], int]:
        """One completion: the assistant message and the tokens it cost."""
        body = {"model": self.model, "messages": messages, "tools": tools, "tool_choice": "auto"}
        reply = await self.http.post("/chat/completions", json=body)
        if reply.status_code != 200:
            raise ChatEndpointError(f"chat endpoint answered HTTP {reply.status_code}: {reply.text[:2000]}")
        try:
            completion = reply.json()
            message = completion["choices"][0]["message"]
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise ChatEndpointError(f"not a chat completion: {reply.text[:2000]}") from exc
        usage = completion.get("usage") or {}
        total = usage.get("total_tokens")
        tokens = (
            total if total is not None else usage.get("prompt_tokens", 0) + usage.get("completion_tokens", 0)
        )
        return message, int(tokens)

    async def aclose(self) -> None:
        await self.http.aclose()


def _tool_message(call_id: str, result: types.CallToolResult) -> tuple[dict[str, Any], dict[str, Any]]:
    """What the model sees of one tool result (the observation and the spend so far), and the
    result's meta (done, reward, metadata)."""
    meta = result.meta or {}
    metadata = meta.get("metadata") or {}
    observation: Any = result.structured_content
    if observation is None:  # a result without structured content: its text
        observation = "\n".join(c.text for c in result.content if isinstance(c, types.TextContent))
    content = {
        "observation": observation,
        "is_error": bool(result.is_error),
        "service_spend": metadata.get("service_spend"),
        "steps_left": metadata.get("steps_left"),
        "seconds_left": metadata.get("seconds_left"),
    }
    return {"role": "tool", "tool_call_id": call_id, "content": json.dumps(content)}, meta


def _arguments(raw: Any) -> dict[str, Any] | str:
    """A tool call's arguments as the model wrote them (a JSON string), or why they are unusable."""
    if isinstance(raw, dict):
        return raw
    try:
        parsed = json.loads(raw or "{}")
    except (TypeError, ValueError) as exc:
        return f"arguments are not JSON: {exc}"
    return parsed if isinstance(parsed, dict) else "arguments must be a JSON object"


async def drive(
    session: Client,
    chat: ChatEndpoint,
    reset_observation: dict[str, Any],
    budget: Budget,
    say: Callable[[str], None] = print,
) -> AgentRun:
    """The agent loop on one episode's MCP session, until the episode ends or a budget is spent."""
    started = time.monotonic()
    run = AgentRun(episode=reset_observation["episode"], stop_reason="")
    tools = chat_tools((await session.list_tools()).tools)
    task = reset_observation.get("task") or {}
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM_PROMPT},
        {
            "role": "user",
            "content": f"Episode {run.episode}. The task:\n{json.dumps(task, indent=1)}",
        },
    ]
    while not run.stop_reason:
        run.stop_reason = budget.spent(run)
        if run.stop_reason:
            break
        message, tokens = await chat.complete(messages, tools)
        run.turns += 1
        run.tokens += tokens
        calls = message.get("tool_calls") or []
        if not calls:
            run.stop_reason = "model_stopped"
            say(f"[{run.episode}] the model stopped: {(message.get('content') or '')[:200]}")
            break
        # Only what the API takes back: endpoints add fields (refusal, reasoning) some refuse as input.
        messages.append({"role": "assistant", "content": message.get("content"), "tool_calls": calls})
        for call in calls:
            if run.tool_calls >= budget.max_tool_calls:  # the rest of this turn's calls are not made
                run.stop_reason = "tool_call_budget"
                break
            name, arguments = call["function"]["name"], _arguments(call["function"].get("arguments"))
            run.tool_calls += 1
            if isinstance(arguments, str):  # not sent: the gateway would refuse it anyway
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": arguments})
                continue
            say(f"[{run.episode}] {name} {json.dumps(arguments)[:120]}")
            reply, meta = _tool_message(call["id"], await session.call_tool(name, arguments))
            messages.append(reply)
            metadata = meta.get("metadata") or {}
            run.service_spend = metadata.get("service_spend") or run.service_spend
            if meta.get("done"):  # also when a limit ended it: the gateway says so at once, reward 0
                run.done, run.stop_reason, run.outcome = True, "finished", metadata.get("outcome")
                reward = metadata.get("reward_decimal")
                run.reward = (
                    reward if reward is not None or meta.get("reward") is None else f"{meta['reward']:g}"
                )
                break
    run.wall_seconds = round(time.monotonic() - started, 1)
    return run


async def run_episode(
    gateway: str,
    orchestrator_token: str,
    task: str,
    chat: ChatEndpoint,
    budget: Budget,
    say: Callable[[str], None] = print,
    backend: str | None = None,
) -> AgentRun:
    """Reset an episode of `task` and let the model play it."""
    observation = await reset_episode(gateway, orchestrator_token, task, backend)
    say(f"[{task}] episode {observation['episode']} started")
    async with agent_client(gateway, observation["metadata"]["agent_token"]) as session:
        return await drive(session, chat, observation, budget, say)


def _stack_defaults() -> tuple[str | None, str | None]:
    """The gateway URL and orchestrator token of the stack `make up` started, when there is one."""
    try:
        from devstack import stack  # only in a checkout of this project
    except ImportError:
        return None, None
    state = stack.load()
    return (state.gateway_url, state.orchestrator_token) if state else (None, None)


def add_gateway_arguments(parser: argparse.ArgumentParser) -> None:
    """`--gateway` and `--orchestrator-token`, defaulting to the running `make up` stack."""
    url, token = _stack_defaults()
    parser.add_argument("--gateway", default=url, required=url is None, help="default: `make up`'s")
    parser.add_argument(
        "--orchestrator-token", default=token, required=token is None, help="default: `make up`'s"
    )


def add_budget_arguments(parser: argparse.ArgumentParser) -> None:
    default = Budget()
    parser.add_argument("--max-tool-calls", type=int, default=default.max_tool_calls)
    parser.add_argument("--max-turns", type=int, default=default.max_turns)
    parser.add_argument("--max-tokens", type=int, default=default.max_tokens)


def budget_from(args: argparse.Namespace) -> Budget:
    return Budget(args.max_tool_calls, args.max_turns, args.max_tokens)


def first_error(exc: BaseException) -> BaseException:
    """The exception inside the groups that task groups (the MCP client's) wrap errors in."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


async def _main(args: argparse.Namespace) -> AgentRun:
    chat = ChatEndpoint.from_env()
    try:
        return await run_episode(
            args.gateway, args.orchestrator_token, args.task, chat, budget_from(args), stderr, args.backend
        )
    finally:
        await chat.aclose()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_gateway_arguments(parser)
    parser.add_argument("--task", default="t0_artifact")
    parser.add_argument("--backend", choices=["hf-jobs", "pods"], help="default: the gateway's")
    add_budget_arguments(parser)
    args = parser.parse_args(argv)
    try:
        run = asyncio.run(_main(args))
    except Exception as exc:
        if not isinstance(first_error(exc), ChatEndpointError):
            raise
        stderr(f"error: {first_error(exc)}")
        return 2
    print(json.dumps(asdict(run)))
    return 0 if run.outcome == "Scored" else 1


if __name__ == "__main__":
    sys.exit(main())
