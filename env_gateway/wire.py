"""Pure wire shapes: an Outcome as an OpenEnv observation, as an MCP tool result, as JSON-RPC.

Metadata goes both top-level and inside `observation` (0.3 clients read only the nested one, 0.10
the top-level one); `error` is exactly {error_type, message}; the gateway's own error code is in
metadata.error_code.
"""

from __future__ import annotations

import json
import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from env_gateway.kube import Unavailable
from env_gateway.schemas import Outcome
from env_gateway.tools import TOOLS

JSONRPC_PARSE_ERROR = -32700
JSONRPC_INVALID_REQUEST = -32600
JSONRPC_METHOD_NOT_FOUND = -32601
JSONRPC_INVALID_PARAMS = -32602
JSONRPC_INTERNAL = -32603
JSONRPC_SERVER_ERROR = -32000
# The platform could not serve the call now (its Kubernetes API is away, restarting or still loading
# its access rules); nothing ran and no step was counted. Retry after data.retry_after_seconds.
JSONRPC_UNAVAILABLE = -32050
UNAVAILABLE_CODE = "platform_unavailable"


def tool_list(snake: bool = False) -> list[dict[str, Any]]:
    """Tool descriptors; `snake` gives OpenEnv's ListToolsObservation form (input_schema)."""
    tools = []
    for spec in TOOLS.values():
        schema = spec.args.model_json_schema()
        if snake:
            tools.append({"name": spec.name, "description": spec.description, "input_schema": schema})
        else:
            tools.append({"name": spec.name, "description": spec.description, "inputSchema": schema})
    return tools


def _content(payload: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"type": "text", "text": json.dumps(payload, separators=(",", ":"))}]


def step_payload(outcome: Outcome) -> dict[str, Any]:
    """The OpenEnv observation envelope for a CallToolAction (WS step, HTTP /step)."""
    result = None
    if outcome.error is None and outcome.result is not None:
        result = {
            "content": _content(outcome.result),
            "structured_content": outcome.result,
            "data": outcome.result,
            "is_error": False,
        }
    observation = {
        "tool_name": outcome.tool_name,
        "result": result,
        "error": outcome.error_view(),
        "metadata": outcome.metadata,
    }
    return {
        "observation": observation,
        "reward": outcome.reward,
        "done": outcome.done,
        "metadata": outcome.metadata,
    }


def list_tools_payload(metadata: dict[str, Any], done: bool, reward: float | None) -> dict[str, Any]:
    observation = {"tools": tool_list(snake=True), "metadata": metadata}
    return {"observation": observation, "reward": reward, "done": done, "metadata": metadata}


def mcp_call_result(outcome: Outcome) -> dict[str, Any]:
    """An MCP-spec CallToolResult, plus `data` (OpenEnv clients unwrap it) and reward/done/spend in _meta."""
    meta = {"done": outcome.done, "reward": outcome.reward, "metadata": outcome.metadata}
    if outcome.error is not None:
        failure = outcome.error.as_dict()
        return {
            "content": _content({"error": failure}),
            "structuredContent": {"error": failure},
            "isError": True,
            "_meta": meta,
        }
    payload = outcome.result or {}
    return {
        "content": _content(payload),
        "structuredContent": payload,
        "isError": False,
        "data": payload,
        "_meta": meta,
    }


def rpc_result(request_id: Any, result: dict[str, Any]) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def rpc_error(request_id: Any, code: int, message: str, data: Any = None) -> dict[str, Any]:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return {"jsonrpc": "2.0", "id": request_id, "error": error}


def outcome_as_rpc_error(request_id: Any, outcome: Outcome) -> dict[str, Any]:
    assert outcome.error is not None
    code = JSONRPC_INVALID_PARAMS if outcome.error.error_type == "invalid_args" else JSONRPC_INTERNAL
    data = {
        **outcome.error.as_dict(),
        "done": outcome.done,
        "reward": outcome.reward,
        "metadata": outcome.metadata,
    }
    return rpc_error(
        request_id, code, f"Error calling tool '{outcome.tool_name}': {outcome.error.message}", data
    )


def retry_after_seconds(exc: Unavailable) -> int:
    """The whole seconds a client should wait (HTTP's Retry-After takes no fraction)."""
    return max(1, math.ceil(exc.retry_after_seconds))


def unavailable_data(exc: Unavailable) -> dict[str, Any]:
    """What every surface says about a call the platform could not serve now."""
    return {
        "code": UNAVAILABLE_CODE,
        "message": f"the platform is unavailable, nothing ran: {exc.detail}",
        "retryable": True,
        "retry_after_seconds": retry_after_seconds(exc),
    }


def rpc_unavailable(request_id: Any, exc: Unavailable) -> dict[str, Any]:
    data = unavailable_data(exc)
    return rpc_error(request_id, JSONRPC_UNAVAILABLE, data["message"], data)


class RpcRequest(BaseModel):
    """A JSON-RPC 2.0 request as OpenEnv sends it (extra keys refused, like upstream)."""

    model_config = ConfigDict(extra="forbid", strict=True)

    jsonrpc: str = Field(pattern=r"^2\.0$")
    method: str = Field(max_length=128)
    params: dict[str, Any] = Field(default_factory=dict)
    id: str | int | None = None


class CallParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(max_length=128)
    arguments: dict[str, Any] | None = None
    session_id: str | None = Field(default=None, max_length=128)
    meta: dict[str, Any] | None = Field(default=None, alias="_meta")


# --- the OpenEnv schema endpoint -----------------------------------------------------------------

ACTION_SCHEMA: dict[str, Any] = {
    "title": "MCPAction",
    "type": "object",
    "properties": {
        "type": {"type": "string", "enum": ["call_tool", "list_tools"]},
        "tool_name": {"type": "string", "enum": sorted(TOOLS)},
        "arguments": {"type": "object"},
        "metadata": {"type": "object"},
    },
}
OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "CallToolObservation",
    "type": "object",
    "properties": {
        "done": {"type": "boolean"},
        "reward": {"anyOf": [{"type": "number"}, {"type": "null"}]},
        "metadata": {"type": "object"},
        "tool_name": {"type": "string"},
        "result": {},
        "error": {
            "anyOf": [
                {
                    "type": "object",
                    "properties": {"error_type": {"type": "string"}, "message": {"type": "string"}},
                    "required": ["error_type", "message"],
                },
                {"type": "null"},
            ]
        },
    },
}
STATE_SCHEMA: dict[str, Any] = {
    "title": "State",
    "type": "object",
    "properties": {
        "episode_id": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "step_count": {"type": "integer", "minimum": 0},
    },
    "additionalProperties": True,
}
RESET_OBSERVATION_SCHEMA: dict[str, Any] = {
    "title": "ResetObservation",
    "type": "object",
    "properties": {
        "task": {"type": "object"},
        "episode": {"type": "string"},
        "metadata": {"type": "object"},
    },
}
