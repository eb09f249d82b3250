"""`POST|GET|DELETE /mcp`: real MCP goes to the SDK's session manager, everything else is the OpenEnv
JSON-RPC dialect (`rpc.py`). The credential is settled here, before the body is read."""

from __future__ import annotations

from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from env_gateway.auth import AuthFailure, bearer
from env_gateway.codec import DecodeError, InvalidRequest, RequestId, decode_json, request_id
from env_gateway.episode_view import EpisodeView
from env_gateway.gateway import Gateway
from env_gateway.kube import Unavailable
from env_gateway.rpc import Caller, dispatch_rpc
from env_gateway.schemas import ToolFailure
from env_gateway.sessions import Sessions
from env_gateway.surface import MAX_BODY_BYTES, JsonReply, host_allowed
from env_gateway.wire import (
    JSONRPC_INVALID_REQUEST,
    JSONRPC_PARSE_ERROR,
    JSONRPC_SERVER_ERROR,
    retry_after_seconds,
    rpc_error,
    rpc_unavailable,
)

# What /mcp reads from a caller with no credential at all: enough for a JSON-RPC shape probe
# (`openenv validate` posts `{}` and expects a JSON-RPC error), never enough to cost a parse.
UNAUTHENTICATED_BODY_BYTES = 256


# The headers /mcp decides on, as ASGI names them (lower case).
READ_HEADERS = frozenset({b"authorization", b"host", b"mcp-session-id", b"mcp-protocol-version"})


def read_headers(scope: Scope) -> dict[bytes, str]:
    """The first value of each of READ_HEADERS that the request has, as Starlette's `Headers.get`
    finds it, in one pass over the headers (rather than one pass, and an exception for an absent
    header, per lookup)."""
    found: dict[bytes, str] = {}
    for key, value in scope["headers"]:
        if key in READ_HEADERS and key not in found:
            found[key] = value.decode("latin-1")
    return found


class HybridMcp:
    """The ASGI app at /mcp. Real MCP (an `Mcp-Session-Id` or `MCP-Protocol-Version` header, `initialize`,
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
        headers = read_headers(scope)
        token = bearer(headers.get(b"authorization"))
        if not host_allowed(headers.get(b"host"), self.gateway.settings.allowed_hosts):
            await JsonReply({"error": {"code": "invalid_host", "message": "Host not allowed"}}, 421)(
                scope, receive, send
            )
            return
        if scope["method"] != "POST":
            await self._to_sdk(scope, receive, send, token, b"")
            return
        try:
            agent, body = await self._credential_then_body(token, receive)
        except (AuthFailure, Unavailable) as exc:
            await _credential_refused(exc)(scope, receive, send)
            return
        except ToolFailure as exc:  # an agent token of an Episode whose task this gateway lacks
            await JsonReply(rpc_error(None, JSONRPC_SERVER_ERROR, exc.message, exc.as_dict()))(
                scope, receive, send
            )
            return
        if body is None:
            await JsonReply(rpc_error(None, JSONRPC_INVALID_REQUEST, "request body too large"), 413)(
                scope, receive, send
            )
            return
        sdk_session = headers.get(b"mcp-session-id")
        # An SDK message: of a session (2025 era), or self-contained with its protocol version (2026).
        for_sdk = sdk_session is not None or headers.get(b"mcp-protocol-version") is not None
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
            if agent is not None:
                await self._post_to_sdk(scope, receive, send, raw, body, sdk_session)
            else:  # the SDK transport is the agent surface: _to_sdk refuses the credential
                await self._to_sdk(scope, receive, send, token, body)
            return
        await self._dialect(scope, receive, send, raw, Caller(token=token, agent=agent))

    async def _credential_then_body(
        self, token: str | None, receive: Receive
    ) -> tuple[EpisodeView | None, bytes | None]:
        """(the agent's episode, the body). A credential is settled before the body is read, and a
        caller without one gets only a few bytes read: an unauthenticated request costs no parsing.
        Which surface a valid token may use is decided per method, further on; an agent token is
        resolved to its episode here, once. The body is None when it passed its limit."""
        agent = None
        if token is not None and not self.gateway.auth.is_orchestrator(token):
            agent = await self.gateway.auth.agent_episode(token)
        limit = UNAUTHENTICATED_BODY_BYTES if token is None else MAX_BODY_BYTES
        body = await _read_body(receive, limit)
        if body is None and token is None:
            await self.gateway.auth.agent_episode(token)  # raises: missing_token
        return agent, body

    async def _dialect(self, scope: Scope, receive: Receive, send: Send, raw: Any, caller: Caller) -> None:
        """A decoded message of the OpenEnv dialect, answered here."""
        try:
            answer = await dispatch_rpc(self.gateway, self.sessions, raw, caller)
        except AuthFailure as exc:
            await JsonReply(exc.body(), exc.status)(scope, receive, send)
            return
        except Unavailable as exc:
            await unavailable_reply(_id_or_null(raw), exc)(scope, receive, send)
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
            await self.gateway.auth.agent_episode(token)
        except (AuthFailure, Unavailable) as exc:
            await _credential_refused(exc)(scope, receive, send)
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


def _credential_refused(exc: AuthFailure | Unavailable) -> JsonReply:
    """The reply to a request whose credential was refused, or could not be checked (no id is known
    yet: the body is read only after)."""
    if isinstance(exc, AuthFailure):
        return JsonReply(exc.body(), exc.status)
    return unavailable_reply(None, exc)


def unavailable_reply(rid: RequestId, exc: Unavailable) -> JsonReply:
    """503 with Retry-After, and the JSON-RPC error every client of /mcp can read (MCP SDK clients
    surface a JSON-RPC error in a non-2xx body as it is)."""
    headers = {"Retry-After": str(retry_after_seconds(exc))}
    return JsonReply(rpc_unavailable(rid, exc), 503, headers=headers)


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
