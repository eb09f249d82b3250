"""The OpenEnv JSON-RPC dialect (`POST /mcp` without an SDK session, and `/ws` `mcp` frames): one
request in, one response out. Translation only: every tool call goes to `Episodes.call_tool`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from env_gateway.auth import AuthFailure
from env_gateway.codec import InvalidRequest, request_id
from env_gateway.episode_view import EpisodeRef, EpisodeView
from env_gateway.gateway import Gateway
from env_gateway.sessions import Session, Sessions
from env_gateway.wire import (
    JSONRPC_INVALID_PARAMS,
    JSONRPC_INVALID_REQUEST,
    JSONRPC_METHOD_NOT_FOUND,
    JSONRPC_SERVER_ERROR,
    CallParams,
    RpcRequest,
    mcp_call_result,
    outcome_as_rpc_error,
    rpc_error,
    rpc_result,
    tool_list,
)

SESSION_METHODS = ("openenv/session/create", "openenv/session/close")


@dataclass(frozen=True)
class Caller:
    """Who sent a message, as far as its transport established it. Over HTTP: the bearer `token`, and
    `agent`, its episode when the transport already resolved it as an agent token. Over `/ws` (the
    orchestrator, checked at the handshake): `ws_episode`, what the connection's session is attached to."""

    token: str | None = None
    agent: EpisodeView | None = None
    over_ws: bool = False
    ws_episode: EpisodeRef | None = None


async def dispatch_rpc(
    gateway: Gateway, sessions: Sessions, raw: Any, caller: Caller
) -> dict[str, Any] | None:
    """One OpenEnv JSON-RPC request -> response (None for notifications). AuthFailure propagates."""
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

    if req.method in SESSION_METHODS:
        if not caller.over_ws:
            gateway.auth.require_orchestrator(caller.token)
        return _session_method(sessions, req, session_id)

    # What a tools/call acts on, settled (with the caller's right to it) before any method is served.
    target: EpisodeView | EpisodeRef | None
    if caller.over_ws:
        target = caller.ws_episode
    elif session_id is not None:
        session = sessions.get(session_id)
        if session is None:
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, f"unknown session_id {session_id[:64]!r}")
        target = await _session_target(gateway, session, caller)
    else:  # the agent surface: the agent token only
        target = caller.agent or await gateway.auth.agent_episode(caller.token)

    if req.method == "ping":
        return rpc_result(req.id, {})
    if req.method == "tools/list":
        return rpc_result(req.id, {"tools": tool_list()})
    if req.method == "tools/call":
        if target is None:
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, "no episode in this session: send reset first")
        try:
            params = CallParams.model_validate(req.params)
        except ValidationError as exc:
            return rpc_error(req.id, JSONRPC_INVALID_PARAMS, f"Invalid params: {exc.errors()[0]['msg']}")
        episode = target if isinstance(target, EpisodeView) else await gateway.episodes.load(target)
        outcome = await gateway.episodes.call_tool(episode, params.name, params.arguments or {})
        if outcome.error is not None and (session_id is not None or caller.over_ws):
            # OpenEnv clients raise only on a JSON-RPC error; plain MCP callers get isError instead.
            return outcome_as_rpc_error(req.id, outcome)
        return rpc_result(req.id, mcp_call_result(outcome))
    return rpc_error(req.id, JSONRPC_METHOD_NOT_FOUND, f"Method not found: {req.method[:64]}")


async def _session_target(
    gateway: Gateway, session: Session, caller: Caller
) -> EpisodeView | EpisodeRef | None:
    """A session is the orchestrator's; an agent may use it only for its own episode."""
    if gateway.auth.is_orchestrator(caller.token):
        return session.episode
    agent = caller.agent or await gateway.auth.agent_episode(caller.token)
    if session.episode is None or agent.ref != session.episode:
        raise AuthFailure(403, "wrong_episode", "this token belongs to another episode than the session's")
    return agent


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
