"""Seeded hostile input for the gateway's three surfaces (the OpenEnv `/mcp` dialect, an MCP SDK
session on `/mcp`, and `/ws`): nesting depth, lone surrogates and invalid UTF-8, huge numbers, wrong
types for every tool argument, batches, non-JSON, binary frames and malformed JSON-RPC envelopes.

Every case is invalid input or a harmless read (ping, tools/list): none may count a step or create
anything, so a run must leave every Episode and AgentJob as it found them."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from env_gateway.gateway import ResetArgs
from env_gateway.openenv import MAX_BODY_BYTES
from env_gateway.tools import TOOLS

RAW = "__raw__"  # where a template takes a literal JSON fragment
# Lone surrogates as JSON escapes: valid JSON syntax, but no Unicode text.
SURROGATE_STRINGS = ['"\\ud800"', '"\\udfff"', '"\\udc00\\ud800"', '"a\\ud83e"', '"\\ud800\\ud800x"']
# Raw bytes that are not UTF-8: an encoded surrogate, a stray byte, overlong, truncated, 5-byte form.
BAD_UTF8 = [b"\xed\xa0\x80", b"\xff", b"\xc0\x80", b"\xe2\x82", b"\xf8\x88\x80\x80\x80"]
HUGE_NUMBERS = [
    "18446744073709551616", "-9223372036854775809", "1" + "0" * 300, "1e400", "-1e400", "9" * 5000,
    "1.5", "-0.0", "1e-400", "123456789012345678901234567890.5",
]  # fmt: skip
WRONG_VALUES: list[Any] = [
    None, True, False, -1, 0, 2**64, -(2**63) - 1, 1.5, 1e308, "", "🦀", "UPPER_case", "x" * 5000,
    [], [None], ["a"] * 40, {}, {"a": {"b": []}},
]  # fmt: skip
# Arguments that satisfy every required field, so that the one wrong field is the only fault.
REQUIRED = {"jobs_submit": {"script": "print(1)"}, "dev_evaluate": {"job": "j"}, "jobs_logs": {"job": "j"},
            "jobs_cancel": {"job": "j"}, "submit": {"job": "j"}}  # fmt: skip
# Ids that tool calls reuse, so that some share an id with another request in flight.
ID_POOL: list[Any] = [0, 1, 2, "1", "🦀", 18446744073709551616, -1, "x" * 256]


def splice(template: Any, fragment: str) -> str:
    """`template` as JSON text with the literal `fragment` where RAW stands."""
    return json.dumps(template).replace(json.dumps(RAW), fragment)


def deep(depth: int, kind: str = "array") -> str:
    return "[" * depth + "]" * depth if kind == "array" else '{"a":' * depth + "1" + "}" * depth


def valid_tool_call(tool: Any, arguments: Any) -> bool:
    """Would the gateway run (and count) this call? Absent arguments mean none, as in MCP."""
    spec = TOOLS.get(tool) if isinstance(tool, str) else None
    if spec is None:
        return False
    try:
        spec.args.model_validate({} if arguments is None else arguments)
    except ValidationError:
        return False
    return True


def wrong_arguments(rng: random.Random, per_field: int = 3) -> list[tuple[str, Any]]:
    """(tool, arguments) with a wrong-typed value in every argument of every tool; plus arguments
    that are not an object at all."""
    cases: list[tuple[str, Any]] = []
    for name, spec in sorted(TOOLS.items()):
        base = REQUIRED.get(name, {})
        for field in [*sorted(spec.args.model_fields), "unknown_key"]:
            for value in rng.sample(WRONG_VALUES, per_field):
                cases.append((name, {**base, field: value}))
        for not_an_object in rng.sample([[], "x", 1, 1.5, True, [base]], 2):
            cases.append((name, not_an_object))
    return [(tool, args) for tool, args in cases if not valid_tool_call(tool, args)]


def rpc(method: str = "ping", params: Any = None, rid: Any = 1) -> dict[str, Any]:
    message: dict[str, Any] = {"jsonrpc": "2.0", "id": rid, "method": method}
    if params is not None:
        message["params"] = params
    return message


# Where a fragment goes in a JSON-RPC request. Tool calls carry no valid arguments anywhere.
POSITIONS: dict[str, Any] = {
    "id": rpc(rid=RAW),
    "method": rpc(method=RAW),
    "params": rpc("tools/call", RAW),
    "tool name": rpc("tools/call", {"name": RAW, "arguments": {}}),
    "arguments": rpc("tools/call", {"name": "jobs_logs", "arguments": RAW}),
    "argument": rpc("tools/call", {"name": "jobs_logs", "arguments": {"job": RAW}}),
    "argument key": rpc("tools/call", {"name": "jobs_logs", "arguments": {RAW: 1}}),
    "session_id": rpc("tools/list", {"session_id": RAW}),
}


@dataclass(frozen=True)
class Case:
    """One HTTP body (bytes as sent)."""

    kind: str
    body: bytes


def rpc_bodies(rng: random.Random) -> list[Case]:
    """Hostile bodies for `POST /mcp`, in both the OpenEnv dialect and an SDK session."""
    cases: list[Case] = []

    def add(kind: str, text: str | bytes) -> None:
        cases.append(Case(kind, text.encode() if isinstance(text, str) else text))

    for template in POSITIONS.values():
        for depth in rng.sample([33, 64, 900, 1000, 10_000, 100_000], 3):
            add("depth", splice(template, deep(depth, rng.choice(["array", "object"]))))
        for fragment in rng.sample(SURROGATE_STRINGS, 2):
            add("surrogate", splice(template, fragment))
        for bad in rng.sample(BAD_UTF8, 2):
            add("invalid utf-8", splice(template, '"a<bad>b"').encode().replace(b"<bad>", bad))
        for number in rng.sample(HUGE_NUMBERS, 3):
            add("huge number", splice(template, number))
    # The reproducers, as reported.
    add("depth", '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + deep(10_000) + "}")
    add("surrogate", '{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}')
    add("invalid utf-8", b'{"jsonrpc":"2.0","id":"\xed\xa0\x80","method":"ping"}')

    for tool, arguments in wrong_arguments(rng):
        call = rpc("tools/call", {"name": tool, "arguments": arguments}, rid=rng.choice(ID_POOL))
        add("wrong type", json.dumps(call))

    one = json.dumps(rpc("tools/list"))
    for batch in ["[]", f"[{one}]", f"[{one},{one}]", "[1,2,3]", f"[[{one}]]", f"[{','.join([one] * 300)}]"]:
        add("batch", batch)

    for envelope in [
        {"id": 1, "method": "ping"}, {"jsonrpc": "1.0", "id": 1, "method": "ping"},
        {"jsonrpc": 2.0, "id": 1, "method": "ping"}, {"jsonrpc": "2.0", "id": 1},
        {"jsonrpc": "2.0", "id": 1, "method": 7}, {"jsonrpc": "2.0", "id": 1, "method": "x" * 1000},
        {"jsonrpc": "2.0", "id": True, "method": "ping"}, {"jsonrpc": "2.0", "id": 1.5, "method": "ping"},
        {"jsonrpc": "2.0", "id": [1], "method": "ping"}, {"jsonrpc": "2.0", "id": {"a": 1}, "method": "ping"},
        {"jsonrpc": "2.0", "id": "x" * 300, "method": "ping"},
        {"jsonrpc": "2.0", "id": 1, "method": "ping", "x": 1},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": []},
        {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"arguments": {}}},
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 5}},
        {"jsonrpc": "2.0", "id": 1, "result": {}}, {"jsonrpc": "2.0", "id": 1, "error": {"code": "x"}},
        {"jsonrpc": "2.0", "method": "notifications/initialized", "params": []},
    ]:  # fmt: skip
        add("envelope", json.dumps(envelope))

    good = json.dumps(rpc("tools/list"))
    for text in ["", " ", "{", "}", "null", "NaN", "Infinity", "-Infinity", "'quoted'", '{"a":1,}',
                 "<?xml version='1.0'?><a/>", "jsonrpc=2.0&method=ping", good[:-1], good + "}",
                 good + " trailing", "\ufeff" + good, "{}" * 1000]:  # fmt: skip
        add("non-json", text)
    for size in (1, 16, 256, 4096):
        add("non-json", rng.randbytes(size))

    # Size: just under the body limit but far too many values, a huge string, and over the limit.
    add("size", "[" + "1," * (MAX_BODY_BYTES // 2 - 10) + "1]")
    big_script = {"name": "jobs_submit", "arguments": {"script": "x" * 900_000}}
    add("size", json.dumps(rpc("tools/call", big_script)))
    add("size", b"[" + b" " * MAX_BODY_BYTES + b"]")
    rng.shuffle(cases)
    return cases


@dataclass(frozen=True)
class Frame:
    """One websocket frame: text, binary, or bytes sent as a text frame (invalid UTF-8)."""

    kind: str
    payload: str | bytes
    text: bool = True


def ws_frames(rng: random.Random) -> list[Frame]:
    frames: list[Frame] = []
    mcp = {"type": "mcp", "data": RAW}
    for case in rpc_bodies(rng):
        if case.kind in ("size", "wrong type") or rng.random() < 0.5:
            continue
        try:
            text = case.body.decode()
        except UnicodeDecodeError:
            raw_body = splice(mcp, "<body>").encode().replace(b"<body>", case.body)
            frames.append(Frame("invalid utf-8", raw_body))
            continue
        frames.append(Frame(case.kind, splice(mcp, text) if text.strip() else text))
    for tool, arguments in wrong_arguments(rng, per_field=2):
        action = {"type": "call_tool", "tool_name": tool, "arguments": arguments}
        frames.append(Frame("wrong type", json.dumps({"type": "step", "data": action})))
    for field in sorted(ResetArgs.model_fields):
        for value in rng.sample(WRONG_VALUES, 3):
            data = {field: value}
            try:
                ResetArgs.model_validate(data)
            except ValidationError:
                frames.append(Frame("wrong type", json.dumps({"type": "reset", "data": data})))
    for template in [{"type": RAW}, {"type": "step", "data": RAW}, {"type": "state", "data": RAW}]:
        for fragment in [deep(40), deep(10_000, "object"), *SURROGATE_STRINGS[:2], *HUGE_NUMBERS[:4]]:
            kind = "depth" if fragment.startswith(("[", "{")) else "huge number"
            frames.append(Frame("surrogate" if "\\u" in fragment else kind, splice(template, fragment)))
    for payload in [b"", b"\x00\x01\x02", json.dumps({"type": "state"}).encode(), rng.randbytes(512)]:
        frames.append(Frame("binary", payload, text=False))
    for text in ["", "{", "NaN", '[{"type":"state"}]', '{"type":"state"}' * 2, "\u0000"]:
        frames.append(Frame("non-json", text))
    frames.append(Frame("size", '{"type":"state","data":{"x":"' + "a" * (MAX_BODY_BYTES + 16) + '"}}'))
    rng.shuffle(frames)
    return frames
