"""The MCP SDK server (official `mcp` v2 low-level Server): real MCP over streamable HTTP.

The SDK serves both protocol eras from one session manager: clients of the 2025 handshake (the `mcp`
1.x generation: `initialize`, then an `Mcp-Session-Id`) and the 2026 single-exchange requests of 2.x
clients (each POST self-contained, its version in the `MCP-Protocol-Version` header).

The low-level Server rather than MCPServer so that every path validates arguments with the same strict
pydantic models (the generated models of the high-level server ignore unknown keys). Each call reads
the agent token from its own HTTP request and goes through the gateway's choke point.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from mcp import types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp.shared.exceptions import MCPError

from env_gateway.auth import AuthFailure, bearer
from env_gateway.codec import sanitized
from env_gateway.config import GatewaySettings
from env_gateway.gateway import Gateway
from env_gateway.kube import Unavailable
from env_gateway.schemas import ToolFailure
from env_gateway.wire import JSONRPC_UNAVAILABLE, mcp_call_result, tool_list, unavailable_data

# The descriptors never change: built once, served to every tools/list.
TOOLS_RESULT = types.ListToolsResult(tools=[types.Tool.model_validate(t) for t in tool_list()])
INPUT_SCHEMAS: dict[str, Mapping[str, Any]] = {t.name: t.input_schema for t in TOOLS_RESULT.tools}


def _agent_token(ctx: ServerRequestContext[Any, Any]) -> str | None:
    headers = getattr(ctx.request, "headers", None)
    return bearer(headers.get("authorization") if headers is not None else None)


def _refused(body: dict[str, Any]) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=json.dumps(body))],
        structured_content=body,
        is_error=True,
    )


def build_server(gateway: Gateway) -> Server[Any]:
    async def list_tools(
        _: ServerRequestContext[Any, Any], __: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return TOOLS_RESULT

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        try:
            episode = await gateway.auth.agent_episode(_agent_token(ctx))
            outcome = await gateway.episodes.call_tool(episode, params.name, params.arguments)
        except AuthFailure as exc:
            return _refused(exc.body())
        except ToolFailure as exc:  # an Episode of a task this gateway does not know
            return _refused({"error": exc.as_dict()})
        except Unavailable as exc:  # a JSON-RPC error, not a tool result: nothing ran
            data = unavailable_data(exc)
            raise MCPError(JSONRPC_UNAVAILABLE, data["message"], data) from exc
        # The SDK serialises replies itself and fails a reply it cannot encode (a tool result can carry
        # text the gateway did not write, such as job logs): hand it only what encodes.
        return types.CallToolResult.model_validate(sanitized(mcp_call_result(outcome)))

    return Server(
        "posttrain-env-gateway",
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        # The schema the SDK checks `Mcp-Param-*` headers against, without running tools/list per call.
        get_tool_input_schema=INPUT_SCHEMAS.get,
    )


def build_session_manager(gateway: Gateway, settings: GatewaySettings) -> StreamableHTTPSessionManager:
    return StreamableHTTPSessionManager(
        app=build_server(gateway),
        json_response=True,
        security_settings=TransportSecuritySettings(
            enable_dns_rebinding_protection=True,
            allowed_hosts=settings.allowed_hosts,
            allowed_origins=settings.allowed_origins,
        ),
    )
