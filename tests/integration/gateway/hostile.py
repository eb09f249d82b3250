"""Seeded hostile input for the gateway's surfaces (the OpenEnv `/mcp` dialect, MCP SDK requests on
`/mcp` of both protocol eras, and `/ws`): nesting depth, lone surrogates and invalid UTF-8, huge
numbers, wrong types for every tool argument, batches, non-JSON, binary frames and malformed JSON-RPC
envelopes; and `run`, which sends it all at once (the fuzz test, and `bench/gateway_hostile.py` for
the figures).

Every case is invalid input or a harmless read (ping, tools/list): none may count a step or create
anything, so a run must leave every Episode and AgentJob as it found them."""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import httpx
import httpx2
import websockets
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from pydantic import ValidationError

from env_gateway.episodes import ResetArgs
from env_gateway.http_mcp import UNAUTHENTICATED_BODY_BYTES
from env_gateway.surface import MAX_BODY_BYTES
from env_gateway.tools import TOOLS

# Generous: a request is "unanswered" only if it takes this long; latency itself is reported.
ANSWER_WITHIN = 60.0
# How /ws may end a connection over input: `close` (1000), binary (1003), not Unicode (1007),
# beyond a limit (1008), too big (1009). 1006 (no close frame) and 1011 (a server bug) never.
INPUT_CLOSE_CODES = {1000, 1003, 1007, 1008, 1009}

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
            "jobs_read_artifact": {"job": "j", "path": "metrics.json"},
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


# --- sending it -----------------------------------------------------------------------------------


@asynccontextmanager
async def sdk_session(url: str, token: str) -> AsyncIterator[dict[str, str]]:
    """The headers that put a raw POST into a new MCP session of the 2025 era (the `initialize`
    handshake, as 1.x clients open one); the session is deleted on the way out."""
    headers = {
        "Authorization": f"Bearer {token}",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }
    client_info = {"name": "fuzz", "version": "0"}
    hello = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": client_info}
    async with httpx.AsyncClient(base_url=url, timeout=ANSWER_WITHIN) as http:
        response = await http.post("/mcp", json=rpc("initialize", hello, rid=0), headers=headers)
        assert response.status_code == 200, response.text
        headers["Mcp-Session-Id"] = response.headers["mcp-session-id"]
        headers["Mcp-Protocol-Version"] = response.json()["result"]["protocolVersion"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post("/mcp", json=initialized, headers=headers)).status_code == 202
        try:
            yield dict(headers)
        finally:
            await http.delete("/mcp", headers=headers)


def sdk_2026_headers(token: str) -> dict[str, str]:
    """A self-contained request of the 2026 era (no session; its version in a header)."""
    return {
        "Authorization": f"Bearer {token}",
        "Mcp-Protocol-Version": "2026-07-28",
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
    }


@asynccontextmanager
async def sdk_client(url: str, token: str) -> AsyncIterator[Client]:
    """A real MCP SDK client, connected as it connects by default (2026 era: no session, no ping)."""
    async with (
        httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=ANSWER_WITHIN) as http,
        # No response cache: every listing is asked of the server.
        Client(streamable_http_client(f"{url}/mcp", http_client=http), cache=None) as client,
    ):
        yield client


@dataclass(frozen=True)
class Seen:
    surface: str
    kind: str
    outcome: str
    seconds: float
    fault: str | None = None


def http_fault(response: httpx.Response) -> str | None:
    if response.status_code >= 500:
        return f"HTTP {response.status_code}: {response.text[:200]}"
    if response.status_code == 202:
        return None
    try:
        body = response.json()
    except ValueError:
        return f"HTTP {response.status_code} with a body that is not JSON: {response.text[:200]!r}"
    return None if isinstance(body, dict) else f"a JSON body that is not an object: {response.text[:200]}"


def refused_unauthenticated(case: Case, response: httpx.Response) -> bool:
    """401 unread, or (for a body a shape probe fits in) a JSON-RPC error; never a result."""
    if response.status_code == 401:
        return True
    small = len(case.body) <= UNAUTHENTICATED_BODY_BYTES
    return small and response.status_code == 200 and "error" in response.json()


async def post_all(
    http: httpx.AsyncClient, surface: str, cases: list[Case], headers: dict[str, str], workers: int
) -> list[Seen]:
    queue, seen = list(cases), []

    async def worker() -> None:
        while queue:
            case = queue.pop()
            start = time.perf_counter()
            try:
                response = await http.post("/mcp", content=case.body, headers=headers)
            except httpx.HTTPError as exc:
                elapsed = time.perf_counter() - start
                seen.append(Seen(surface, case.kind, "no answer", elapsed, f"no answer: {exc!r}"))
                continue
            elapsed = time.perf_counter() - start
            fault = http_fault(response)
            if surface == "no token" and not refused_unauthenticated(case, response):
                fault = f"not refused: HTTP {response.status_code} {response.text[:200]}"
            seen.append(Seen(surface, case.kind, str(response.status_code), elapsed, fault))

    await asyncio.gather(*(worker() for _ in range(workers)))
    return seen


async def send_all(
    ws_url: str, headers: dict[str, str], episode: str, frames: list[Frame], workers: int
) -> list[Seen]:
    """Frames over `workers` connections, each attached to `episode`; a closed one is replaced."""
    queue, seen = list(frames), []

    async def attach() -> websockets.ClientConnection:
        conn = await websockets.connect(ws_url, additional_headers=headers, max_size=None)
        await conn.send(json.dumps({"type": "reset", "data": {"episode": episode}}))
        reply = json.loads(await asyncio.wait_for(conn.recv(), ANSWER_WITHIN))
        assert reply["type"] == "observation", reply
        return conn

    async def worker() -> None:
        conn: websockets.ClientConnection | None = None
        while queue:
            frame = queue.pop()
            conn = conn or await attach()
            start = time.perf_counter()
            try:
                await conn.send(frame.payload, text=frame.text)
                reply = await asyncio.wait_for(conn.recv(), ANSWER_WITHIN)
            except websockets.ConnectionClosed as exc:
                code = exc.rcvd.code if exc.rcvd is not None else None
                fault = None if code in INPUT_CLOSE_CODES else f"closed with {code} ({exc.rcvd})"
                seen.append(Seen("ws", frame.kind, f"close {code}", time.perf_counter() - start, fault))
                await conn.close()
                conn = None
                continue
            except TimeoutError:
                seen.append(Seen("ws", frame.kind, "no answer", time.perf_counter() - start, "no answer"))
                await conn.close()
                conn = None
                continue
            elapsed = time.perf_counter() - start
            try:
                kind = json.loads(reply)["type"]
            except (ValueError, KeyError, TypeError):
                seen.append(
                    Seen("ws", frame.kind, "reply", elapsed, f"a reply that is not ours: {reply!r:.200}")
                )
                continue
            seen.append(Seen("ws", frame.kind, f"reply {kind}", elapsed))
        if conn is not None:
            await conn.close()

    await asyncio.gather(*(worker() for _ in range(workers)))
    return seen


async def steady_client(client: Client, done: asyncio.Event) -> list[Seen]:
    """A well-behaved MCP client beside the fuzzed surfaces: it must be answered all along."""
    seen = []
    while not done.is_set():
        start = time.perf_counter()
        try:
            await asyncio.wait_for(client.list_tools(), ANSWER_WITHIN)
            fault = None
        except Exception as exc:
            fault = f"the well-behaved client failed: {exc!r}"
        outcome = "ok" if fault is None else "failed"
        seen.append(Seen("sdk client", "tools/list", outcome, time.perf_counter() - start, fault))
    return seen


def p99(times: list[float]) -> float:
    return statistics.quantiles(times, n=100, method="inclusive")[98] if len(times) > 1 else times[0]


def report(seen: list[Seen]) -> str:
    lines = []
    for surface in [*sorted({s.surface for s in seen}), "all"]:
        times = sorted(s.seconds for s in seen if surface in ("all", s.surface))
        lines.append(
            f"{surface:>10}: n={len(times):4d} p50={statistics.median(times) * 1000:7.1f} ms "
            f"p99={p99(times) * 1000:7.1f} ms max={times[-1] * 1000:7.1f} ms"
        )
    outcomes = Counter((s.surface, s.kind, s.outcome) for s in seen)
    lines += [
        f"  {n:4d} x {surface} {kind} -> {outcome}"
        for (surface, kind, outcome), n in sorted(outcomes.items())
    ]
    return "\n".join(lines)


async def run(
    url: str, ws_url: str, orchestrator: dict[str, str], episode: str, token: str, seed: int
) -> list[Seen]:
    """The whole seeded corpus at once: the OpenEnv dialect, an SDK session (2025 era) and
    self-contained SDK requests (2026 era) with `token`, a few bodies with no credential, `/ws` frames
    on connections attached to `episode`, and a well-behaved MCP client all along."""
    bodies = rpc_bodies(random.Random(seed))
    frames = ws_frames(random.Random(seed + 1))
    unauthenticated = random.Random(seed + 2).sample(bodies, 25)
    agent = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
    done = asyncio.Event()
    async with (
        sdk_session(url, token) as sdk_headers,
        sdk_client(url, token) as other_client,
        httpx.AsyncClient(base_url=url, timeout=ANSWER_WITHIN) as http,
    ):
        steady = asyncio.create_task(steady_client(other_client, done))
        runs = await asyncio.gather(
            post_all(http, "openenv", bodies, agent, workers=3),
            post_all(http, "sdk", bodies, sdk_headers, workers=3),
            post_all(http, "sdk 2026", bodies, sdk_2026_headers(token), workers=2),
            post_all(http, "no token", unauthenticated, {"Content-Type": "application/json"}, workers=1),
            send_all(ws_url, orchestrator, episode, frames, workers=3),
        )
        done.set()
        return [s for run in runs for s in run] + await steady
