"""Hostile input on every surface (the OpenEnv `/mcp` dialect, MCP SDK requests of both protocol eras,
`/ws`): the reported reproducers as regression tests, and a seeded fuzz run over all of them at once.
Bad input gets a 4xx, a JSON-RPC error or a websocket close frame with a code; never a 5xx, never a dropped
socket, never a request left waiting behind someone else's; and it changes nothing."""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import secrets
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import websockets

from devstack.controlplane import cluster as devcluster
from env_gateway.config import GatewaySettings
from env_gateway.http_mcp import UNAUTHENTICATED_BODY_BYTES
from env_gateway.tools import TOOLS
from tests.helpers import Kubectl
from tests.integration.gateway import hostile
from tests.integration.gateway.hostile import ANSWER_WITHIN, deep, rpc, sdk_client, sdk_session
from tests.integration.gateway.support import GatewayServer, serve, snapshot
from tests.integration.support import episode_manifest, get

SEED = 19
PING = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
DEEP_BODY = '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":' + deep(10_000) + "}"
SURROGATE_ID = b'{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}'  # the escape, written literally
SURROGATE_ID_BYTES = b'{"jsonrpc":"2.0","id":"\xed\xa0\x80","method":"ping"}'  # an encoded surrogate


@pytest.fixture(scope="module")
def lone_gateway(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, gateway_sa_token: Path
) -> Iterator[GatewayServer]:
    """The gateway alone, shared by this module's tests: decoding and refusing need no operator, and
    an Episode made with kubectl makes an agent token valid (it stays Pending, which no test minds)."""
    namespace = f"t-{uuid.uuid4().hex[:10]}"
    kubectl("create", "namespace", namespace)
    token = secrets.token_urlsafe(24)
    settings = GatewaySettings(
        namespace=namespace,
        orchestrator_token=token,  # type: ignore[arg-type]
        broker_url="http://127.0.0.1:9",  # never asked: no request here is valid enough to reach it
        broker_token_file=str(gateway_sa_token),
        kubeconfig=str(cluster.kubeconfig),
    )
    try:
        for url in serve(settings):
            yield GatewayServer(url, token, namespace)
    finally:
        kubectl("delete", "namespace", namespace, "--wait=false", check=False)


def agent_episode(kubectl: Kubectl, gw: GatewayServer) -> tuple[str, str]:
    """A fresh Episode and its agent token: (name, token)."""
    token = secrets.token_urlsafe(32)
    name = f"hostile-{secrets.token_hex(4)}"
    manifest = episode_manifest(name, agentTokenHash=hashlib.sha256(token.encode()).hexdigest())
    kubectl("-n", gw.namespace, "apply", "-f", "-", input=json.dumps(manifest))
    return name, token


def post(gw: GatewayServer, body: bytes | str, token: str | None, **headers: str) -> httpx.Response:
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    headers.setdefault("Content-Type", "application/json")
    return httpx.post(f"{gw.url}/mcp", content=body, headers=headers, timeout=ANSWER_WITHIN)


async def in_session(gw: GatewayServer, headers: dict[str, str], message: Any) -> httpx.Response:
    """A raw POST into an SDK session (`headers` from `sdk_session`), off the event loop."""
    body = message if isinstance(message, bytes) else json.dumps(message)
    return await asyncio.to_thread(post, gw, body, None, **headers)


def rpc_error_code(response: httpx.Response) -> int:
    code: int = response.json()["error"]["code"]
    return code


# --- the reproducers ------------------------------------------------------------------------------


async def test_a_10000_deep_body_is_a_parse_error_not_a_500(
    lone_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    _, token = agent_episode(kubectl, lone_gateway)
    for body in (DEEP_BODY, deep(1000), '{"a":' * 990 + "1" + "}" * 990):
        response = post(lone_gateway, body, token)
        assert response.status_code == 200, response.text
        assert response.json()["id"] is None and rpc_error_code(response) == -32700, response.text
    assert post(lone_gateway, json.dumps(PING), token).json()["result"] == {}


async def test_a_lone_surrogate_id_is_a_parse_error_not_a_500(
    lone_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    _, token = agent_episode(kubectl, lone_gateway)
    for body in (SURROGATE_ID, SURROGATE_ID_BYTES):
        for credential in (token, None):  # a body this small is parsed without a credential too
            response = post(lone_gateway, body, credential)
            assert response.status_code == 200, response.text
            assert rpc_error_code(response) == -32700 and response.json()["id"] is None
        assert post(lone_gateway, body, "not-a-token").status_code == 401
    # A surrogate pair is a real character, and comes back as one.
    crab = post(lone_gateway, b'{"jsonrpc":"2.0","id":"\\ud83e\\udd80","method":"ping"}', token)
    assert crab.json() == {"jsonrpc": "2.0", "id": "\N{CRAB}", "result": {}}


async def test_ids_are_strings_integers_or_null_and_anything_else_is_minus_32600(
    lone_gateway: GatewayServer,
    kubectl: Kubectl,
) -> None:
    _, token = agent_episode(kubectl, lone_gateway)
    for good in (2**64, -(2**63), "\N{CRAB}", 0, None):
        answer = post(lone_gateway, json.dumps({**PING, "id": good}), token).json()
        assert answer == {"jsonrpc": "2.0", "id": good, "result": {}}
    for bad in (1.5, True, [1], {"a": 1}, "x" * 300):
        response = post(lone_gateway, json.dumps({**PING, "id": bad}), token)
        assert response.status_code == 200
        assert response.json()["id"] is None and rpc_error_code(response) == -32600, response.text
    batch = post(lone_gateway, json.dumps([PING, PING]), token)
    assert rpc_error_code(batch) == -32600 and "batch" in batch.json()["error"]["message"]


async def test_unauthenticated_requests_are_refused_before_the_body_is_parsed(
    lone_gateway: GatewayServer,
) -> None:
    garbage = b"\xff not json" * 100
    for body in (DEEP_BODY.encode(), SURROGATE_ID_BYTES * 10, garbage, b"[" * 100_000):
        assert len(body) > UNAUTHENTICATED_BODY_BYTES
        missing = post(lone_gateway, body, None)
        assert missing.status_code == 401 and missing.json()["error"]["code"] == "missing_token"
    for body in (DEEP_BODY.encode(), SURROGATE_ID_BYTES, garbage, b"{}"):
        wrong = post(lone_gateway, body, "not-a-token")
        assert wrong.status_code == 401 and wrong.json()["error"]["code"] == "invalid_token"
    # Without a credential a few bytes are read: `openenv validate` probes `{}` for a JSON-RPC error;
    # anything that needs the credential is refused all the same, the MCP SDK transport included.
    probe = post(lone_gateway, b"{}", None)
    assert probe.status_code == 200 and probe.json()["jsonrpc"] == "2.0" and rpc_error_code(probe) == -32600
    initialize = {**PING, "method": "initialize", "params": {"protocolVersion": "2025-06-18"}}
    for message in (PING, rpc("tools/list"), initialize):
        assert post(lone_gateway, json.dumps(message), None).status_code == 401
    in_session = post(lone_gateway, json.dumps(PING), None, **{"Mcp-Session-Id": "0" * 32})
    assert in_session.status_code == 401
    modern = post(lone_gateway, json.dumps(PING), None, **{"Mcp-Protocol-Version": "2026-07-28"})
    assert modern.status_code == 401
    # An authenticated caller does get its body parsed (and refused for what it is).
    parsed = post(lone_gateway, garbage, lone_gateway.orchestrator_token)
    assert parsed.status_code == 200 and rpc_error_code(parsed) == -32700


@pytest.mark.parametrize(
    ("frame", "as_text", "code"),
    [
        (b"\x00\x01", False, 1003),
        (deep(10_000), True, 1008),
        ('{"type":"mcp","data":{"jsonrpc":"2.0","id":"\\ud800","method":"ping"}}', True, 1007),
        ('{"type":"state","data":{"x":"' + "a" * (1024 * 1024) + '"}}', True, 1009),
        # Not UTF-8 in a text frame: the server's websocket layer refuses it before the gateway sees it.
        (b'{"type":"state","x":"\xed\xa0\x80"}', True, 1007),
    ],
    ids=["binary-frame", "10000-deep-frame", "lone-surrogate-mcp-id", "oversize-frame", "invalid-utf8-text"],
)
async def test_ws_frames_that_end_the_connection_close_it_with_a_code(
    lone_gateway: GatewayServer, frame: str | bytes, as_text: bool, code: int
) -> None:
    async with websockets.connect(
        lone_gateway.ws_url, additional_headers=lone_gateway.orchestrator_headers(), max_size=None
    ) as ws:
        await ws.send(frame, text=as_text)
        with pytest.raises(websockets.ConnectionClosed) as closed:
            await asyncio.wait_for(ws.recv(), ANSWER_WITHIN)
    assert closed.value.rcvd is not None, "the server dropped the socket without a close frame"
    assert closed.value.rcvd.code == code, closed.value.rcvd
    if isinstance(frame, str) or not as_text:  # the gateway's own closes say why
        assert closed.value.rcvd.reason, closed.value.rcvd


async def test_ws_frames_that_are_not_json_get_an_error_reply_and_the_connection_stays(
    lone_gateway: GatewayServer,
) -> None:
    async with websockets.connect(
        lone_gateway.ws_url, additional_headers=lone_gateway.orchestrator_headers()
    ) as ws:
        for text in ("{", "NaN", "", '{"type":"state"} trailing'):
            await ws.send(text)
            reply = json.loads(await asyncio.wait_for(ws.recv(), ANSWER_WITHIN))
            assert reply["type"] == "error" and reply["data"]["code"] == "INVALID_JSON", reply
        await ws.send(json.dumps({"type": "mcp", "data": {**PING, "id": 1.5}}))
        invalid_id = json.loads(await asyncio.wait_for(ws.recv(), ANSWER_WITHIN))
        assert invalid_id["data"]["error"]["code"] == -32600 and invalid_id["data"]["id"] is None
        await ws.send(json.dumps({"type": "state"}))
        state = json.loads(await asyncio.wait_for(ws.recv(), ANSWER_WITHIN))
        assert state == {"type": "state", "data": {"episode_id": None, "step_count": 0}}


async def test_sdk_session_refuses_malformed_messages_with_4xx_and_goes_on(
    lone_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    _, token = agent_episode(kubectl, lone_gateway)
    async with sdk_session(lone_gateway.url, token) as headers:
        surrogate_name = b'{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"\\ud800"}}'
        for body in (SURROGATE_ID, SURROGATE_ID_BYTES, surrogate_name, DEEP_BODY.encode(), b"{"):
            response = await in_session(lone_gateway, headers, body)
            assert response.status_code == 400 and rpc_error_code(response) == -32700, response.text
        for bad_id in (1.5, True, {"a": 1}):
            response = await in_session(lone_gateway, headers, {**PING, "id": bad_id})
            assert response.status_code == 400 and rpc_error_code(response) == -32600, response.text
        assert (await in_session(lone_gateway, headers, PING)).json()["result"] == {}
        tools = (await in_session(lone_gateway, headers, rpc("tools/list", rid=2))).json()["result"]["tools"]
        assert {t["name"] for t in tools} >= {"task_info", "jobs_wait"}


async def test_sdk_session_refuses_an_id_already_in_flight_and_still_answers_the_first(
    lone_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    """The SDK pairs a reply with the POST waiting for str(id): a second request with that id used to
    take the first one's reply and leave it waiting forever."""
    episode, token = agent_episode(kubectl, lone_gateway)
    async with sdk_session(lone_gateway.url, token) as headers:
        wait = rpc("tools/call", {"name": "jobs_wait", "arguments": {"timeout_seconds": 25}}, rid=7)
        first = asyncio.create_task(in_session(lone_gateway, headers, wait))
        # In flight once its step is counted (the step is taken before the wait begins).
        while get(kubectl, lone_gateway.namespace, "episode", episode).get("status", {}).get("steps") != 1:
            assert not first.done(), first.result().text
            await asyncio.sleep(0.1)
        for same in (7, "7"):
            refused = await in_session(lone_gateway, headers, {**PING, "id": same})
            assert refused.status_code == 409 and rpc_error_code(refused) == -32600, refused.text
        other = await in_session(lone_gateway, headers, {**PING, "id": 8})
        assert other.status_code == 200 and other.json()["result"] == {}
        assert not first.done(), "jobs_wait answered before the duplicates were refused"
        # Still waiting, on its own reply stream: cancel it (MCP's notifications/cancelled) rather than
        # sit out the wait, and that reply, with its id, reaches it at once.
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 7}}
        assert (await in_session(lone_gateway, headers, cancel)).status_code == 202
        answered = await first
        assert answered.status_code == 200, answered.text
        assert answered.json()["id"] == 7 and answered.json()["error"]["message"] == "Request cancelled"
        again = await in_session(lone_gateway, headers, {**PING, "id": 7})
        assert again.json() == {"jsonrpc": "2.0", "id": 7, "result": {}}


async def test_sdk_session_with_reused_huge_and_emoji_ids_answers_every_request(
    lone_gateway: GatewayServer,
    kubectl: Kubectl,
) -> None:
    """Requests reusing ids like 2**64 or an emoji in one session are each answered (a reply, or 409
    for an id in flight), and another client's session is served all along."""
    _, token = agent_episode(kubectl, lone_gateway)
    ids: list[Any] = [18446744073709551616, "\N{CRAB}", 1, "1", 0, -1]
    rng = random.Random(SEED)
    async with (
        sdk_session(lone_gateway.url, token) as headers,
        sdk_client(lone_gateway.url, token) as other_client,
        httpx.AsyncClient(base_url=lone_gateway.url, headers=headers, timeout=ANSWER_WITHIN) as http,
    ):

        async def one() -> int:
            message = rng.choice([rpc("ping"), rpc("tools/list"), rpc("tools/call", {"name": "jobs_logs"})])
            response = await http.post("/mcp", content=json.dumps({**message, "id": rng.choice(ids)}))
            return response.status_code

        async def steady() -> int:
            for _ in range(10):
                assert len((await other_client.list_tools()).tools) == len(TOOLS)
            return 0

        *statuses, _ = await asyncio.gather(*(one() for _ in range(60)), steady())
    assert set(statuses) <= {200, 409}, Counter(statuses)
    assert 200 in statuses


# --- the fuzz run ---------------------------------------------------------------------------------


async def test_seeded_fuzz_over_every_surface_never_500s_never_drops_and_changes_nothing(
    lone_gateway: GatewayServer, kubectl: Kubectl, record_property: Any
) -> None:
    episode, token = agent_episode(kubectl, lone_gateway)
    before = snapshot(kubectl, lone_gateway.namespace)
    gw = lone_gateway
    seen = await hostile.run(gw.url, gw.ws_url, gw.orchestrator_headers(), episode, token, SEED)
    summary = hostile.report(seen)
    print(summary)  # the latency figures: shown with -s or -rA
    record_property("hostile_requests", len(seen))
    record_property("hostile_p99_seconds", round(hostile.p99([s.seconds for s in seen]), 3))

    faults = [s for s in seen if s.fault is not None]
    assert not faults, "\n".join(f"{s.surface} {s.kind}: {s.fault}" for s in faults[:20]) + "\n" + summary
    surfaces = Counter(s.surface for s in seen)
    corpus = len(hostile.rpc_bodies(random.Random(SEED)))
    assert surfaces["openenv"] == surfaces["sdk"] == surfaces["sdk 2026"] == corpus
    assert surfaces["ws"] == len(hostile.ws_frames(random.Random(SEED + 1))) and surfaces["no token"] == 25
    assert surfaces["sdk client"] > 0
    assert snapshot(kubectl, lone_gateway.namespace) == before
