"""The OpenEnv wire protocol: the hybrid `POST /mcp` (OpenEnv JSON-RPC dialect, handing real MCP to
the SDK) and the orchestrator's `WS /ws`. Translation only: every tool call goes to
`Gateway.call_tool`."""

from __future__ import annotations

import base64
import binascii
import logging
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.datastructures import Headers
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send
from starlette.websockets import WebSocket, WebSocketDisconnect

from env_gateway.codec import (
    WS_INTERNAL_ERROR,
    WS_NORMAL,
    WS_POLICY,
    WS_TOO_BIG,
    WS_UNSUPPORTED_DATA,
    DecodeError,
    InvalidRequest,
    RequestId,
    decode_json,
    encode_json,
    encode_text,
    request_id,
)
from env_gateway.gateway import AgentToken, AuthFailure, Binding, EpisodeRef, Gateway, bearer
from env_gateway.schemas import ToolFailure
from env_gateway.wire import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_PARSE_ERROR,
    JSONRPC_SERVER_ERROR,
    CallParams,
    RpcRequest,
    list_tools_payload,
    mcp_call_result,
    outcome_as_rpc_error,
    rpc_error,
    rpc_result,
    step_payload,
    tool_list,
)

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 1024 * 1024
MAX_FRAME_CHARS = MAX_BODY_BYTES
# What /mcp reads from a caller with no credential at all: enough for a JSON-RPC shape probe
# (`openenv validate` posts `{}` and expects a JSON-RPC error), never enough to cost a parse.
UNAUTHENTICATED_BODY_BYTES = 256


class JsonReply(Response):
    """A JSON response through the one encoder: it renders whatever the reply carries."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_json(content)


# --- sessions ------------------------------------------------------------------------------------


@dataclass
class Session:
    id: str
    episode: EpisodeRef | None = None
    ws_attached: bool = False
    closing: bool = False


class Sessions:
    """OpenEnv sessions of this process (`openenv/session/create`, one per WS connection)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._by_id: dict[str, Session] = {}

    def create(self) -> Session | None:
        if len(self._by_id) >= self.capacity:
            return None
        session = Session(id=str(uuid.uuid4()))
        self._by_id[session.id] = session
        return session

    def get(self, session_id: str) -> Session | None:
        return self._by_id.get(session_id)

    def close(self, session: Session) -> None:
        self._by_id.pop(session.id, None)

    def __len__(self) -> int:
        return len(self._by_id)


def host_allowed(host: str | None, patterns: list[str]) -> bool:
    """The MCP SDK's DNS-rebinding rule (exact, or `name:*` for any port), for the paths it doesn't serve."""
    if not host:
        return False
    return any(host == p or (p.endswith(":*") and host.startswith(p[:-1])) for p in patterns)


def orchestrator_credential(headers: Headers) -> str | None:
    """Bearer, or Basic with the token as password: openenv-core 0.3 clients can't set headers but
    send `http://user:TOKEN@host` userinfo as Basic auth."""
    header = headers.get("authorization")
    token = bearer(header)
    if token is not None or not header:
        return token
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic" or len(value) > 1024:
        return None
    try:
        decoded = base64.b64decode(value.strip(), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return None
    return decoded.partition(":")[2] or None


# --- JSON-RPC dialect (POST /mcp and WS "mcp") -----------------------------------------------------


async def dispatch_rpc(
    gateway: Gateway,
    sessions: Sessions,
    raw: Any,
    *,
    token: str | None,
    ws_binding: EpisodeRef | None = None,
    over_ws: bool = False,
    agent_token_checked: bool = False,
) -> dict[str, Any] | None:
    """One OpenEnv JSON-RPC request -> response (None for notifications). AuthFailure propagates.
    `agent_token_checked`: the caller already resolved `token` to an episode (no second lookup)."""
    try:
        rid = request_id(raw)
    except InvalidRequest as exc:
        return rpc_error(None, JSONRPC_INVALID_REQUEST, f"Invalid Request: {exc}")
    try:
        req = RpcRequest.model_validate(raw)
    except ValidationError:
        return rpc_error(rid, JSONRPC_INVALID_REQUEST, "Invalid Request: a JSON-RPC 2.0 object is required")
    if req.method.startswith("notifications/"):
        return None
    session_id = req.params.get("session_id")
    if session_id is not None and not isinstance(session_id, str):
        return rpc_error(req.id, JSONRPC_INVALID_PARAMS, "session_id must be a string")

    if req.method in ("openenv/session/create", "openenv/session/close"):
        if not over_ws:
            gateway.require_orchestrator(token)
        return _session_method(sessions, req, session_id)

    binding: Binding
    if ws_binding is not None or over_ws:
        if ws_binding is None and req.method == "tools/call":
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, "no episode in this session: send reset first")
        binding = ws_binding or EpisodeRef("", "")
    elif session_id is not None:
        session = sessions.get(session_id)
        if session is None:
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, f"unknown session_id {session_id[:64]!r}")
        binding = await _session_binding(gateway, session, token)
        if session.episode is None and req.method == "tools/call":
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, "no episode in this session: reset it first")
    else:
        if not agent_token_checked:
            await gateway.episode_for_token(token)  # agent surface: the agent token only
        binding = AgentToken(token or "")

    if req.method == "ping":
        return rpc_result(req.id, {})
    if req.method == "tools/list":
        return rpc_result(req.id, {"tools": tool_list()})
    if req.method == "tools/call":
        try:
            params = CallParams.model_validate(req.params)
        except ValidationError as exc:
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, f"Invalid params: {exc.errors()[0]['msg']}")
        outcome = await gateway.call_tool(binding, params.name, params.arguments or {})
        if outcome.error is not None and (session_id is not None or over_ws):
            # OpenEnv clients raise only on a JSON-RPC error; plain MCP callers get isError instead.
            return outcome_as_rpc_error(req.id, outcome)
        return rpc_result(req.id, mcp_call_result(outcome))
    return rpc_error(req.id, JSONRPC_METHOD_NOT_FOUND, f"Method not found: {req.method[:64]}")


async def _session_binding(gateway: Gateway, session: Session, token: str | None) -> Binding:
    """A session is the orchestrator's; an agent may use it only for its own episode."""
    if gateway.is_orchestrator(token):
        return session.episode or EpisodeRef("", "")
    episode = await gateway.episode_for_token(token)
    if session.episode is None or (episode.namespace, episode.name) != (
        session.episode.namespace,
        session.episode.name,
    ):
        raise AuthFailure(403, "wrong_episode", "this token belongs to another episode than the session's")
    return AgentToken(token or "")


def _session_method(sessions: Sessions, req: RpcRequest, session_id: str | None) -> dict[str, Any]:
    if req.method == "openenv/session/create":
        session = sessions.create()
        if session is None:
            return rpc_error(
                req.id, JSONRPC_SERVER_ERROR, f"Server at capacity: {len(sessions)}/{sessions.capacity}"
            )
        return rpc_result(req.id, {"session_id": session.id})
    found = sessions.get(session_id) if session_id else None
    if found is None:
        return rpc_error(req.id, JSONRPC_INVALID_PARAMS, "unknown session_id")
    if found.ws_attached:
        found.closing = True
        return rpc_result(req.id, {"session_id": found.id, "closed": False, "closing": True})
    sessions.close(found)
    return rpc_result(req.id, {"session_id": found.id, "closed": True})


class HybridMcp:
    """ASGI app at /mcp. Real MCP (an `Mcp-Session-Id` or `MCP-Protocol-Version` header, `initialize`,
    GET/DELETE) goes to the SDK's session manager; everything else is the OpenEnv JSON-RPC dialect,
    answered here."""

    def __init__(self, gateway: Gateway, sessions: Sessions, sdk: StreamableHTTPSessionManager) -> None:
        self.gateway = gateway
        self.sessions = sessions
        self.sdk = sdk
        # (Mcp-Session-Id, str(id)) of SDK-session requests being served. The SDK routes a reply to
        # the POST waiting for str(id): a second request with that id in flight would take the
        # first one's reply and leave it waiting forever.
        self._sdk_in_flight: set[tuple[str, str]] = set()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = Headers(scope=scope)
        token = bearer(headers.get("authorization"))
        if not host_allowed(headers.get("host"), self.gateway.settings.allowed_hosts):
            await JsonReply({"error": {"code": "invalid_host", "message": "Host not allowed"}}, 421)(
                scope, receive, send
            )
            return
        if scope["method"] != "POST":
            await self._to_sdk(scope, receive, send, token, b"")
            return
        # A credential is settled before the body is read, and a caller without one gets only a few
        # bytes read: an unauthenticated request costs no parsing. (Which surface a valid token may
        # use is decided per method, further on; `agent`: resolved to an episode here, once.)
        agent = token is not None and not self.gateway.is_orchestrator(token)
        try:
            if agent:
                await self.gateway.episode_for_token(token)
            limit = UNAUTHENTICATED_BODY_BYTES if token is None else MAX_BODY_BYTES
            body = await _read_body(receive, limit)
            if body is None and token is None:
                await self.gateway.episode_for_token(token)  # raises: missing_token
        except AuthFailure as exc:
            await JsonReply(exc.body(), exc.status)(scope, receive, send)
            return
        if body is None:
            await JsonReply(rpc_error(None, JSONRPC_INVALID_REQUEST, "request body too large"), 413)(
                scope, receive, send
            )
            return
        sdk_session = headers.get("mcp-session-id")
        # An SDK message: of a session (2025 era), or self-contained with its protocol version (2026).
        for_sdk = sdk_session is not None or headers.get("mcp-protocol-version") is not None
        # Streamable HTTP refuses bad input with a 4xx; the OpenEnv dialect answers 200, as upstream.
        refused = 400 if for_sdk else 200
        try:
            raw = decode_json(body)
        except DecodeError as exc:
            await JsonReply(rpc_error(None, JSONRPC_PARSE_ERROR, f"Parse error: {exc.message}"), refused)(
                scope, receive, send
            )
            return
        if for_sdk or (isinstance(raw, dict) and raw.get("method") == "initialize"):
            if agent:
                await self._post_to_sdk(scope, receive, send, raw, body, sdk_session)
            else:  # the SDK transport is the agent surface: _to_sdk refuses the credential
                await self._to_sdk(scope, receive, send, token, body)
            return
        try:
            answer = await dispatch_rpc(
                self.gateway,
                self.sessions,
                raw,
                token=token,
                agent_token_checked=agent,
            )
        except AuthFailure as exc:
            await JsonReply(exc.body(), exc.status)(scope, receive, send)
            return
        except ToolFailure as exc:
            answer = rpc_error(_id_or_null(raw), JSONRPC_SERVER_ERROR, exc.message, exc.as_dict())
        if answer is None:
            await Response(status_code=202)(scope, receive, send)
        else:
            await JsonReply(answer)(scope, receive, send)

    async def _post_to_sdk(
        self,
        scope: Scope,
        receive: Receive,
        send: Send,
        raw: Any,
        body: bytes,
        sdk_session: str | None,
    ) -> None:
        """A decoded message from an authenticated agent for the SDK: its id checked, and refused
        while another request of the same session with the same id is in flight."""
        try:
            rid = request_id(raw)
        except InvalidRequest as exc:
            await JsonReply(rpc_error(None, JSONRPC_INVALID_REQUEST, f"Invalid Request: {exc}"), 400)(
                scope, receive, send
            )
            return
        key = None
        if sdk_session is not None and rid is not None and "method" in raw:
            key = (sdk_session, str(rid))
            if key in self._sdk_in_flight:
                message = f"Invalid Request: id {rid!r} is in use by a request in flight in this session"
                await JsonReply(rpc_error(rid, JSONRPC_INVALID_REQUEST, message[:400]), 409)(
                    scope, receive, send
                )
                return
            self._sdk_in_flight.add(key)
        try:
            await self._hand_to_sdk(scope, receive, send, body)
        finally:
            if key is not None:
                self._sdk_in_flight.discard(key)

    async def _to_sdk(
        self, scope: Scope, receive: Receive, send: Send, token: str | None, body: bytes
    ) -> None:
        try:
            await self.gateway.episode_for_token(token)
        except AuthFailure as exc:
            await JsonReply(exc.body(), exc.status)(scope, receive, send)
            return
        await self._hand_to_sdk(scope, receive, send, body)

    async def _hand_to_sdk(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        """The request to the SDK, its body (already read here) replayed."""
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed and scope["method"] == "POST":
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.sdk.handle_request(scope, replay, send)


def _id_or_null(raw: Any) -> RequestId:
    try:
        return request_id(raw)
    except InvalidRequest:
        return None


async def _read_body(receive: Receive, limit: int) -> bytes | None:
    """The body, or None once it is longer than `limit` (the rest is not read)."""
    chunks, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return b""
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


# --- WS /ws ----------------------------------------------------------------------------------------


class WsMessage(BaseModel):
    model_config = ConfigDict(extra="forbid")

    type: Literal["reset", "step", "state", "mcp", "close"]
    data: dict[str, Any] = Field(default_factory=dict)


class StepAction(BaseModel):
    """CallToolAction / ListToolsAction as OpenEnv clients send them (`type` may be omitted)."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["call_tool", "list_tools"] | None = None
    tool_name: str | None = Field(default=None, max_length=128)
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


def _ws_error(code: str, message: str, **extra: Any) -> dict[str, Any]:
    return {"type": "error", "data": {"message": message, "code": code, **extra}}


class OrchestratorSocket:
    """One `/ws` connection = one OpenEnv session; strictly one reply per frame, in order."""

    def __init__(self, gateway: Gateway, sessions: Sessions, ws: WebSocket) -> None:
        self.gateway = gateway
        self.sessions = sessions
        self.ws = ws

    async def run(self) -> None:
        ws = self.ws
        if not host_allowed(ws.headers.get("host"), self.gateway.settings.allowed_hosts):
            await ws.close(code=WS_POLICY)
            return
        try:
            self.gateway.require_orchestrator(orchestrator_credential(ws.headers))
        except AuthFailure as exc:
            await _deny(ws, exc)
            return
        session = self._attach(ws.query_params.get("session_id"))
        await ws.accept()
        if session is None:
            await self._send(
                _ws_error(
                    "CAPACITY_REACHED",
                    f"Server at capacity: {len(self.sessions)}/{self.sessions.capacity} sessions active",
                    active_sessions=len(self.sessions),
                    max_sessions=self.sessions.capacity,
                )
            )
            await ws.close(code=WS_NORMAL)
            return
        try:
            await self._serve(session)
        except WebSocketDisconnect:
            pass
        except Exception:  # a bug, not the peer: still end with a code, never a dropped socket
            log.exception("ws connection failed")
            await _close_quietly(ws, WS_INTERNAL_ERROR, "internal error")
        finally:
            session.ws_attached = False
            self.sessions.close(session)

    async def _serve(self, session: Session) -> None:
        """Frames until the peer leaves, sends `close`, or sends what ends the connection: a binary
        frame (1003), text that is not Unicode (1007), beyond a limit (1008), or too large (1009)."""
        ws = self.ws
        while True:
            message = await ws.receive()
            if message["type"] == "websocket.disconnect":
                return
            text = message.get("text")
            if text is None:
                await ws.close(WS_UNSUPPORTED_DATA, "binary frames are not accepted: send JSON text")
                return
            if len(text) > MAX_FRAME_CHARS:
                await ws.close(WS_TOO_BIG, f"a frame holds at most {MAX_FRAME_CHARS} characters")
                return
            try:
                raw = decode_json(text)
            except DecodeError as exc:
                if exc.close_code is not None:
                    await ws.close(exc.close_code, exc.message[:120])
                    return
                await self._send(_ws_error("INVALID_JSON", f"Invalid JSON: {exc.message}"))
                continue
            reply = await self._handle(session, raw)
            if reply is None:
                await ws.close(WS_NORMAL)
                return
            await self._send(reply)

    async def _send(self, reply: dict[str, Any]) -> None:
        await self.ws.send_text(encode_text(reply))

    def _attach(self, session_id: str | None) -> Session | None:
        if session_id:
            found = self.sessions.get(session_id)
            if found is not None and not found.ws_attached:
                found.ws_attached = True
                return found
        session = self.sessions.create()
        if session is not None:
            session.ws_attached = True
        return session

    async def _handle(self, session: Session, raw: Any) -> dict[str, Any] | None:
        if not isinstance(raw, dict) or raw.get("type") not in ("reset", "step", "state", "mcp", "close"):
            kind = raw.get("type") if isinstance(raw, dict) else None
            return _ws_error("UNKNOWN_TYPE", f"Unknown message type: {str(kind)[:64]}")
        try:
            msg = WsMessage.model_validate(raw)
        except ValidationError as exc:
            return _ws_error("VALIDATION_ERROR", "Invalid message", errors=_errors(exc))
        try:
            if msg.type == "close":
                return None
            if msg.type == "reset":
                return await self._reset(session, msg.data)
            if msg.type == "state":
                return {"type": "state", "data": await self._state(session)}
            if msg.type == "mcp":
                answer = await dispatch_rpc(
                    self.gateway,
                    self.sessions,
                    msg.data,
                    token=None,
                    ws_binding=session.episode,
                    over_ws=True,
                )
                return {"type": "mcp", "data": answer or {}}
            return await self._step(session, msg.data)
        except (ToolFailure, AuthFailure) as exc:
            return _ws_error("EXECUTION_ERROR", exc.message, error_code=exc.code)
        except Exception as exc:  # the connection stays open, as upstream; details go to the log
            log.exception("ws %s failed", msg.type)
            return _ws_error("EXECUTION_ERROR", f"{type(exc).__name__}: internal error")

    async def _reset(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        result = await self.gateway.reset(data)
        episode = result.episode
        session.episode = EpisodeRef(episode.namespace, episode.name)
        metadata = self.gateway.observe(episode)
        # The agent token goes back to the orchestrator only, here, once; the Episode keeps its hash.
        metadata["agent_token"] = result.agent_token
        metadata["agent_mcp_path"] = "/mcp"
        observation = {
            "task": episode.task.public_view().model_dump(mode="json"),
            "episode": episode.name,
            "metadata": metadata,
        }
        payload = {
            "observation": observation,
            "reward": episode.reward,
            "done": episode.done,
            "metadata": metadata,
        }
        return {"type": "observation", "data": payload}

    async def _state(self, session: Session) -> dict[str, Any]:
        if session.episode is None:
            return {"episode_id": None, "step_count": 0}
        episode = await self.gateway.load(session.episode)
        return {
            "episode_id": episode.name,
            "step_count": episode.status.steps,
            "done": episode.done,
            "reward": episode.reward,
            **self.gateway.observe(episode),
        }

    async def _step(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        try:
            action = StepAction.model_validate(data)
        except ValidationError as exc:
            return _ws_error("VALIDATION_ERROR", "Invalid action", errors=_errors(exc))
        if session.episode is None:
            return _ws_error(
                "EXECUTION_ERROR", "no episode in this session: send reset first", error_code="no_episode"
            )
        if action.type == "list_tools" or (action.type is None and action.tool_name is None):
            episode = await self.gateway.load(session.episode)
            payload = list_tools_payload(self.gateway.observe(episode), episode.done, episode.reward)
            return {"type": "observation", "data": payload}
        if action.tool_name is None:
            return _ws_error("VALIDATION_ERROR", "call_tool needs tool_name", errors=[])
        outcome = await self.gateway.call_tool(session.episode, action.tool_name, action.arguments)
        return {"type": "observation", "data": step_payload(outcome)}


def _errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()[:10]]


async def _deny(ws: WebSocket, exc: AuthFailure) -> None:
    """Refuse the handshake with the JSON body when the server supports it, else a bare 403."""
    if "websocket.http.response" in ws.scope.get("extensions", {}):
        await ws.send_denial_response(JsonReply(exc.body(), exc.status))
    else:
        await ws.close(code=WS_POLICY)


async def _close_quietly(ws: WebSocket, code: int, reason: str) -> None:
    try:
        await ws.close(code, reason)
    except Exception:  # already closed or gone: nothing more can be said
        log.debug("ws close after failure failed", exc_info=True)
