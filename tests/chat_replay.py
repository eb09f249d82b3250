"""A chat-completions server that replays a recorded tool-calling conversation, standing in for a model
endpoint (none is reachable from the tests).

It answers `POST /v1/chat/completions` with the recording's next assistant turn, and refuses, with HTTP
400 and the reason, any request that is not the conversation it recorded: another model, other tools
offered, a role out of place, a tool call left unanswered or answered under another id. Job names are
generated per run, so an argument written `{{<call id>:<path>}}` is filled from this run's answer to
that call (the `tool` message's JSON content); a turn with `until` is replayed while that path of its
answer is false, as a model calls `jobs_wait` again until the job is finished.

Each conversation is keyed by its first user message, so one server can replay it to several episodes.

    python -m tests.chat_replay tests/data/t0_artifact_conversation.json   # serves until interrupted
"""

from __future__ import annotations

import json
import re
import sys
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

PLACEHOLDER = re.compile(r"^\{\{(?P<call>[^:{}]+):(?P<path>[^{}]+)\}\}$")
API_KEY = "replay-key"


class Mismatch(Exception):
    """The request is not the recorded conversation."""


@dataclass
class Play:
    """One replay of the conversation: the turns sent so far and this run's answers to their calls."""

    key: str
    sent: list[tuple[int, list[str]]] = field(default_factory=list)  # (turn, the call ids sent)
    answers: dict[str, Any] = field(default_factory=dict)  # recorded call id -> its latest answer
    tokens: int = 0  # the usage reported, summed

    @property
    def turns_played(self) -> list[int]:
        return [turn for turn, _ in self.sent]


def _lookup(value: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(value, dict) or part not in value:
            raise Mismatch(f"no {path!r} in the answer {json.dumps(value)[:500]}")
        value = value[part]
    return value


class Conversation:
    """The recording and the replays of it; every method holds the lock (requests come on threads)."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self.model: str = recording["model"]
        self.tools: list[str] = sorted(recording["tools"])
        self.turns: list[dict[str, Any]] = recording["turns"]
        for index, turn in enumerate(self.turns):
            if "until" in turn and len(turn["tool_calls"]) != 1:
                raise ValueError(f"turn {index}: 'until' needs exactly one tool call")
        self.plays: dict[str, Play] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        with self.lock:
            try:
                return self._reply(body)
            except Mismatch as exc:
                self.errors.append(str(exc))
                raise

    def _reply(self, body: dict[str, Any]) -> dict[str, Any]:
        if body.get("model") != self.model:
            raise Mismatch(f"model {body.get('model')!r}, but the recording is of {self.model!r}")
        if body.get("stream"):
            raise Mismatch("streaming was asked for; the recording replays whole completions")
        self._check_tools(body.get("tools"))
        messages = body.get("messages")
        if not isinstance(messages, list) or len(messages) < 2:
            raise Mismatch("the conversation must open with a system and a user message")
        roles = [m.get("role") if isinstance(m, dict) else None for m in messages[:2]]
        if roles != ["system", "user"]:
            raise Mismatch(f"the conversation opens with roles {roles}, not ['system', 'user']")
        key = str(messages[1].get("content"))
        if len(messages) == 2:
            play = self.plays[key] = Play(key)  # a new episode, or the same one started over
        elif key not in self.plays:
            raise Mismatch("a conversation this server never started (its user message is unknown)")
        else:
            play = self.plays[key]
        self._check_history(play, messages[2:])
        turn = self._next_turn(play)
        return self._completion(play, turn, body)

    def _check_tools(self, tools: Any) -> None:
        names: list[str] = []
        for tool in tools or []:
            function = tool.get("function") if isinstance(tool, dict) else None
            if not isinstance(function, dict) or tool.get("type") != "function":
                raise Mismatch(f"a tool that is not a function: {json.dumps(tool)[:300]}")
            if not isinstance(function.get("parameters"), dict):
                raise Mismatch(f"tool {function.get('name')!r} has no parameters schema")
            names.append(str(function.get("name")))
        if sorted(names) != self.tools:
            raise Mismatch(f"tools offered {sorted(names)}, but the recording offered {self.tools}")

    def _check_history(self, play: Play, history: list[Any]) -> None:
        """`history` must be each reply sent, then a tool message per call, in order, and no more."""
        at = 0
        for number, (turn, ids) in enumerate(play.sent, start=1):
            assistant = history[at] if at < len(history) else None
            if not isinstance(assistant, dict) or assistant.get("role") != "assistant":
                raise Mismatch(f"reply {number} (turn {turn}) is missing, or not an assistant's message")
            got = [c.get("id") for c in assistant.get("tool_calls") or []]
            if got != ids:
                raise Mismatch(f"reply {number} (turn {turn}) comes back with tool calls {got}, not {ids}")
            at += 1
            for call_id in ids:
                answer = history[at] if at < len(history) else None
                if not isinstance(answer, dict) or answer.get("role") != "tool":
                    raise Mismatch(f"turn {turn}: tool call {call_id} is not answered by a tool message")
                if answer.get("tool_call_id") != call_id:
                    raise Mismatch(f"turn {turn}: {call_id} answered as {answer.get('tool_call_id')!r}")
                try:
                    content = json.loads(answer.get("content") or "")
                except ValueError:
                    content = answer.get("content")
                play.answers[call_id.split("~")[0]] = content
                at += 1
        if at != len(history):
            raise Mismatch(f"{len(history) - at} messages after the last reply's answers")

    def _next_turn(self, play: Play) -> int:
        if not play.sent:
            return 0
        last = play.sent[-1][0]
        until = self.turns[last].get("until")
        if until and not _lookup(play.answers[self.turns[last]["tool_calls"][0]["id"]], until):
            return last
        if last + 1 >= len(self.turns):
            raise Mismatch(f"the recording ends after turn {last} ({len(self.turns)} turns); asked for more")
        return last + 1

    def _fill(self, play: Play, value: Any) -> Any:
        if isinstance(value, dict):
            return {k: self._fill(play, v) for k, v in value.items()}
        if isinstance(value, list):
            return [self._fill(play, v) for v in value]
        match = PLACEHOLDER.match(value) if isinstance(value, str) else None
        if match is None:
            return value
        if match["call"] not in play.answers:
            raise Mismatch(f"{value}: call {match['call']} has not been answered in this conversation")
        return _lookup(play.answers[match["call"]], match["path"])

    def _completion(self, play: Play, turn: int, body: dict[str, Any]) -> dict[str, Any]:
        repeats = sum(1 for sent, _ in play.sent if sent == turn)
        calls: list[dict[str, Any]] = []
        for call in self.turns[turn]["tool_calls"]:
            call_id = call["id"] if not repeats else f"{call['id']}~{repeats + 1}"
            arguments = self._fill(play, call["arguments"])
            calls.append({
                "id": call_id,
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(arguments)},
            })  # fmt: skip
        play.sent.append((turn, [c["id"] for c in calls]))
        message = {"role": "assistant", "content": self.turns[turn].get("content"), "tool_calls": calls}
        # Token counts are estimated (4 characters a token), so that a token budget has something to sum.
        prompt = len(json.dumps(body["messages"])) // 4
        completion = len(json.dumps(message)) // 4
        play.tokens += prompt + completion
        return {
            "id": f"chatcmpl-replay-{len(play.sent)}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": self.model,
            "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls"}],
            "usage": {"prompt_tokens": prompt, "completion_tokens": completion,
                      "total_tokens": prompt + completion},
        }  # fmt: skip


class ChatReplay:
    """The conversation served on a loopback port (a thread), as an OpenAI-compatible base URL."""

    def __init__(self, recording: Path, api_key: str = API_KEY) -> None:
        self.conversation = Conversation(json.loads(recording.read_text()))
        self.api_key = api_key
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, name="chat-replay", daemon=True)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/v1"

    @property
    def model(self) -> str:
        return self.conversation.model

    @property
    def errors(self) -> list[str]:
        with self.conversation.lock:
            return list(self.conversation.errors)

    def plays(self) -> list[Play]:
        with self.conversation.lock:
            return list(self.conversation.plays.values())

    def env(self) -> dict[str, str]:
        """The driver's environment for this server."""
        return {"OPENAI_BASE_URL": self.base_url, "OPENAI_MODEL": self.model, "OPENAI_API_KEY": self.api_key}

    def __enter__(self) -> ChatReplay:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        replay = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                if self.path.rstrip("/") != "/v1/chat/completions":
                    return self._send(404, _error(f"no route {self.path}; try /v1/chat/completions"))
                if self.headers.get("Authorization") != f"Bearer {replay.api_key}":
                    return self._send(401, _error("missing or wrong API key", "invalid_api_key"))
                try:
                    body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
                except ValueError as exc:
                    return self._send(400, _error(f"the body is not JSON: {exc}"))
                try:
                    self._send(200, replay.conversation.reply(body))
                except Mismatch as exc:
                    self._send(400, _error(f"not the recorded conversation: {exc}", "replay_mismatch"))

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:
                pass  # refusals are kept in `errors` and sent to the client

        return Handler


def _error(message: str, kind: str = "invalid_request_error") -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "code": None}}


if __name__ == "__main__":
    with ChatReplay(Path(sys.argv[1])) as replay:
        print(" ".join(f"{k}={v}" for k, v in replay.env().items()), flush=True)
        threading.Event().wait()
