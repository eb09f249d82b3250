"""`WS /ws`, the orchestrator's OpenEnv socket: `reset`, `step`, `state`, `mcp`, `close`; one reply per
frame, in order. Translation only: every tool call goes to `Episodes.call_tool`."""

from __future__ import annotations

import logging
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.websockets import WebSocket, WebSocketDisconnect

from env_gateway.auth import AuthFailure, orchestrator_credential
from env_gateway.codec import (
    WS_INTERNAL_ERROR,
    WS_NORMAL,
    WS_POLICY,
    WS_TOO_BIG,
    WS_UNSUPPORTED_DATA,
    DecodeError,
    decode_json,
    encode_text,
)
from env_gateway.gateway import Gateway
from env_gateway.kube import Unavailable
from env_gateway.rpc import Caller, dispatch_rpc
from env_gateway.schemas import ToolFailure
from env_gateway.sessions import Session, Sessions
from env_gateway.surface import MAX_BODY_BYTES, JsonReply, host_allowed
from env_gateway.wire import list_tools_payload, rpc_unavailable, step_payload, unavailable_data

log = logging.getLogger(__name__)
MAX_FRAME_CHARS = MAX_BODY_BYTES


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
            self.gateway.auth.require_orchestrator(orchestrator_credential(ws.headers))
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
                return {"type": "mcp", "data": await self._mcp(session, msg.data)}
            return await self._step(session, msg.data)
        except (ToolFailure, AuthFailure) as exc:
            return _ws_error("EXECUTION_ERROR", exc.message, error_code=exc.code)
        except Unavailable as exc:  # nothing ran: the same frame may be sent again
            data = unavailable_data(exc)
            return _ws_error("SERVICE_UNAVAILABLE", data.pop("message"), error_code=data.pop("code"), **data)
        except Exception as exc:  # the connection stays open, as upstream; details go to the log
            log.exception("ws %s failed", msg.type)
            return _ws_error("EXECUTION_ERROR", f"{type(exc).__name__}: internal error")

    async def _mcp(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        caller = Caller(over_ws=True, ws_episode=session.episode)
        try:
            answer = await dispatch_rpc(self.gateway, self.sessions, data, caller)
        except Unavailable as exc:  # a JSON-RPC request gets its JSON-RPC error
            return rpc_unavailable(data.get("id"), exc)
        return answer or {}

    async def _reset(self, session: Session, data: dict[str, Any]) -> dict[str, Any]:
        result = await self.gateway.episodes.reset(data)
        episode = result.episode
        session.episode = episode.ref
        metadata = self.gateway.episodes.observe(episode)
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
        episode = await self.gateway.episodes.load(session.episode)
        return {
            "episode_id": episode.name,
            "step_count": episode.status.steps,
            "done": episode.done,
            "reward": episode.reward,
            **self.gateway.episodes.observe(episode),
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
            episode = await self.gateway.episodes.load(session.episode)
            payload = list_tools_payload(self.gateway.episodes.observe(episode), episode.done, episode.reward)
            return {"type": "observation", "data": payload}
        if action.tool_name is None:
            return _ws_error("VALIDATION_ERROR", "call_tool needs tool_name", errors=[])
        episode = await self.gateway.episodes.load(session.episode)
        outcome = await self.gateway.episodes.call_tool(episode, action.tool_name, action.arguments)
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
