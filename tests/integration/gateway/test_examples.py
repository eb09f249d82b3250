"""The orchestrator and agent examples, run as a user runs them (their CLIs, as subprocesses) against the
real gateway: an operator whose jobs really run under the launcher, graded for real. The LLM driver
talks to the chat replay server (tests/chat_replay.py), the one stand-in, as no model endpoint is
reachable here."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.chat_replay import API_KEY, ChatReplay
from tests.helpers import Kubectl, kubectl_json
from tests.integration.gateway.support import GatewayServer

REPO = Path(__file__).resolve().parents[3]
EXAMPLES = REPO / "examples"
RECORDING = REPO / "tests" / "data" / "t0_artifact_conversation.json"
RECORDED_TURNS = len(json.loads(RECORDING.read_text())["turns"])


def run_example(
    script: str, gw: GatewayServer, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), "--gateway", gw.url,
         f"--orchestrator-token={gw.orchestrator_token}", *args],  # one argument: a token may start with "-"
        capture_output=True, text=True, timeout=540, cwd=REPO,
        env={**os.environ, "NO_PROXY": "127.0.0.1,localhost", **(env or {})},
    )  # fmt: skip


def summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The driver's last line: its run as JSON."""
    run: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return run


def episode(kubectl: Kubectl, gw: GatewayServer, name: str) -> dict[str, Any]:
    body: dict[str, Any] = kubectl_json(kubectl, "-n", gw.namespace, "get", "episode", name)
    return body


def started_at(body: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(body["status"]["startedAt"])


def ended_at(body: dict[str, Any]) -> datetime:
    [ended] = [c for c in body["status"]["conditions"] if c["type"] == "Ended" and c["status"] == "True"]
    return datetime.fromisoformat(ended["lastTransitionTime"])


def assert_settled(spend: dict[str, Any]) -> None:
    """An ended episode: nothing reserved any more, and the agent's jobs were charged."""
    assert Decimal(spend["reserved_usd"]) == 0 and Decimal(spend["settled_usd"]) > 0, spend


# --- the LLM agent driver ---------------------------------------------------------------------


def test_llm_agent_plays_the_recorded_conversation_to_reward_one(
    executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    with ChatReplay(RECORDING) as replay:
        proc = run_example("llm_agent.py", executing_gateway, env=replay.env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert replay.errors == []
    run = summary(proc)
    assert run["stop_reason"] == "finished" and run["done"] is True
    assert run["reward"] == "1" and run["outcome"] == "Scored", run
    # Every recorded turn was asked for, in order (the waits as often as the jobs took), and no more.
    [play] = replay.plays()
    assert sorted(set(play.turns_played)) == list(range(RECORDED_TURNS))
    assert play.turns_played == sorted(play.turns_played)
    assert run["turns"] == run["tool_calls"] == len(play.turns_played)
    assert run["tokens"] == play.tokens > 0  # the endpoint's usage, summed
    assert_settled(run["service_spend"])
    # Each tool message held the observation and the episode's spend at that step.
    assert play.answers["call_train"]["observation"]["job"]["purpose"] == "train"
    assert all(Decimal(a["service_spend"]["budget_usd"]) > 0 for a in play.answers.values())
    # The gateway counted exactly the calls the model made, and the Episode holds the same reward.
    body = episode(kubectl, executing_gateway, run["episode"])
    assert body["status"]["steps"] == run["tool_calls"]
    assert body["status"]["reward"] == "1" and body["status"]["outcome"] == "Scored"


@pytest.mark.parametrize(
    ("flags", "reason", "calls"),
    [(["--max-tool-calls", "3"], "tool_call_budget", 3), (["--max-tokens", "1"], "token_budget", 1)],
    ids=["three tool calls", "one token"],
)
def test_llm_agent_stops_when_its_budget_is_spent(
    flags: list[str], reason: str, calls: int, gateway: GatewayServer, kubectl: Kubectl
) -> None:
    with ChatReplay(RECORDING) as replay:
        proc = run_example("llm_agent.py", gateway, *flags, env=replay.env())
    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert replay.errors == []
    run = summary(proc)
    assert run["stop_reason"] == reason and run["done"] is False and run["reward"] is None, run
    # One chat request per tool call here: none was asked for once the budget was spent.
    [play] = replay.plays()
    assert play.turns_played == list(range(calls))
    assert run["tool_calls"] == run["turns"] == calls
    assert episode(kubectl, gateway, run["episode"])["status"]["steps"] == calls


def test_llm_agent_fails_clearly_when_the_endpoint_refuses_the_conversation(
    gateway: GatewayServer,
) -> None:
    with ChatReplay(RECORDING) as replay:
        proc = run_example("llm_agent.py", gateway, env={**replay.env(), "OPENAI_MODEL": "another-model"})
    assert proc.returncode == 2
    assert "chat endpoint answered HTTP 400" in proc.stderr
    assert "model 'another-model', but the recording is of 'replay-t0-artifact'" in proc.stderr
    assert replay.errors == ["model 'another-model', but the recording is of 'replay-t0-artifact'"]


def _tools(names: list[str]) -> list[dict[str, Any]]:
    return [{"type": "function", "function": {"name": n, "parameters": {"type": "object"}}} for n in names]


OFFERED = _tools(json.loads(RECORDING.read_text())["tools"])
OPENING = [{"role": "system", "content": "s"}, {"role": "user", "content": "episode e1"}]


@pytest.mark.parametrize(
    ("after_first_reply", "tools", "refusal"),
    [
        (lambda reply: [reply], OFFERED, "tool call call_task_info is not answered by a tool message"),
        (
            lambda reply: [reply, {"role": "tool", "tool_call_id": "call_other", "content": "{}"}],
            OFFERED,
            "call_task_info answered as 'call_other'",
        ),
        (
            lambda reply: [{"role": "tool", "tool_call_id": "call_task_info", "content": "{}"}],
            OFFERED,
            "reply 1 (turn 0) is missing, or not an assistant's message",
        ),
        (
            lambda reply: [reply, {"role": "tool", "tool_call_id": "call_task_info", "content": "{}"}],
            OFFERED[1:],
            "tools offered",
        ),
    ],
    ids=["a tool call left unanswered", "answered under another id", "the reply dropped", "a tool missing"],
)
def test_replay_server_refuses_a_conversation_it_did_not_record(
    after_first_reply: Any, tools: list[dict[str, Any]], refusal: str
) -> None:
    with ChatReplay(RECORDING) as replay, httpx.Client(base_url=replay.base_url) as http:
        headers = {"Authorization": f"Bearer {API_KEY}"}
        first = http.post("/chat/completions", json={"model": replay.model, "messages": OPENING,
                                                     "tools": OFFERED}, headers=headers)  # fmt: skip
        assert first.status_code == 200, first.text
        reply = first.json()["choices"][0]["message"]
        assert reply["tool_calls"][0]["function"]["name"] == "task_info"
        messages = OPENING + after_first_reply(reply)
        second = http.post(
            "/chat/completions", json={"model": replay.model, "messages": messages, "tools": tools},
            headers=headers,
        )  # fmt: skip
    assert second.status_code == 400
    assert second.json()["error"]["type"] == "replay_mismatch"
    assert refusal in second.json()["error"]["message"]
    assert len(replay.errors) == 1 and refusal in replay.errors[0]
    assert replay.plays()[0].turns_played == [0]  # nothing more was replayed


# --- the orchestrator examples ----------------------------------------------------------------

ROLLOUT_ROW = re.compile(r"^\s*(?P<rollout>\d+)\s+(?P<episode>\S+)\s+(?P<reward>\S+)\s+(?P<spend>\S+)"
                         r"\s+(?P<steps>\d+)\s+(?P<wall>[\d.]+)$")  # fmt: skip


def test_trl_loop_plays_three_rollouts_in_parallel_each_to_reward_one(
    executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    proc = run_example("trl_env_loop.py", executing_gateway, "--rollouts", "3")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["rollout", "episode", "reward", "spend", "$", "steps", "wall", "s"]
    rows = [m.groupdict() for m in map(ROLLOUT_ROW.match, lines[1:]) if m]
    assert [r["rollout"] for r in rows] == ["0", "1", "2"], proc.stdout
    assert len({r["episode"] for r in rows}) == 3
    for row in rows:
        assert row["reward"] == "1" and Decimal(row["spend"]) > 0, row
        assert int(row["steps"]) >= 6  # jobs_submit, dev_evaluate and submit, a wait after each
    assert lines[-1] == "mean reward 1.000 over 3 of 3 rollouts"
    bodies = [episode(kubectl, executing_gateway, r["episode"]) for r in rows]
    for row, body in zip(rows, bodies, strict=True):
        assert body["status"]["reward"] == "1" and body["status"]["steps"] == int(row["steps"])
    # In parallel: every episode had started before any of them ended.
    assert max(map(started_at, bodies)) <= min(map(ended_at, bodies))


def test_grpo_trains_two_steps_on_episodes_whose_reward_and_spend_reach_the_trainer(
    executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    """TRL's GRPOTrainer with a tiny policy, each rollout an episode (TRL's `environment_factory`); the
    scripted agent finishes each episode the policy leaves."""
    proc = run_example("grpo_openenv.py", executing_gateway, "--task", "t0_artifact", "--steps", "2")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    run = summary(proc)
    assert run["steps"] == 2
    episodes = run["episodes"]
    assert len(episodes) == 4 and len({e["episode"] for e in episodes}) == 4  # 2 steps x 2 generations
    for played in episodes:
        body = episode(kubectl, executing_gateway, played["episode"])
        assert body["status"]["reward"] == "1" and played["reward"] == 1.0, (played, body["status"])
        assert played["service_spend_usd"] > 0
    for logged in run["logged"]:  # what the trainer recorded, per step
        assert logged["rewards/PostTrainEnvironment/mean"] == 1.0 and logged["reward"] == 1.0, logged
        assert logged["rewards/service_spend_usd/mean"] > 0  # reported, weighted 0
    assert len(run["logged"]) == 2


HARNESS_ROW = re.compile(r"^\s*(?P<index>\d+)\s+(?P<episode>\S+)\s+(?P<reward>\S+)\s+(?P<outcome>\S+)"
                         r"\s+(?P<spend>\S+)\s+(?P<wall>[\d.]+)$")  # fmt: skip
SUMMARY_ROW = re.compile(r"^\s*all\s+mean reward, total spend\s+(?P<mean>\S+)\s+(?P<scored>\d+/\d+) scored"
                         r"\s+(?P<spend>\S+)\s+(?P<wall>[\d.]+)$")  # fmt: skip


@pytest.mark.parametrize("agent", ["scripted", "llm"])
def test_eval_harness_runs_two_episodes_and_prints_its_table(
    agent: str, executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    with ChatReplay(RECORDING) as replay:
        proc = run_example(
            "eval_harness.py", executing_gateway, "--episodes", "2", "--agent", agent, env=replay.env()
        )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0].split() == ["#", "episode", "reward", "outcome", "spend", "$", "wall", "s"]
    rows = [m.groupdict() for m in map(HARNESS_ROW.match, lines[1:]) if m]
    assert [r["index"] for r in rows] == ["0", "1"], proc.stdout
    for row in rows:
        assert row["reward"] == "1" and row["outcome"] == "Scored" and Decimal(row["spend"]) > 0, row
        assert episode(kubectl, executing_gateway, row["episode"])["status"]["reward"] == "1"
    total = SUMMARY_ROW.match(lines[-1])
    assert total is not None, lines[-1]
    assert total["mean"] == "1.000" and total["scored"] == "2/2"
    assert Decimal(total["spend"]) == sum(Decimal(r["spend"]) for r in rows)
    # The LLM agent: each episode was its own replay of the whole conversation.
    plays = replay.plays()
    assert replay.errors == []
    if agent == "llm":
        assert len(plays) == 2
        assert all(sorted(set(p.turns_played)) == list(range(RECORDED_TURNS)) for p in plays)
    else:
        assert plays == []
