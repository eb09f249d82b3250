"""The MCP SDK server (official `mcp` v1.x low-level Server): real MCP over streamable HTTP.

The low-level Server rather than FastMCP so that every path validates arguments with the same strict
pydantic models (FastMCP's generated models ignore unknown keys). Each call reads the agent token
from its own HTTP request and goes through the gateway's choke point.
"""

from __future__ import annotations

import json
from typing import Any

from mcp import types
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings

from env_gateway.codec import sanitized
from env_gateway.config import GatewaySettings
from env_gateway.gateway import AgentToken, AuthFailure, Gateway, bearer
from env_gateway.wire import mcp_call_result, tool_list


def build_server(gateway: Gateway) -> Server[Any, Any]:
    server: Server[Any, Any] = Server("posttrain-env-gateway")

    @server.list_tools()  # type: ignore[no-untyped-call,untyped-decorator]
    async def list_tools() -> list[types.Tool]:
        return [types.Tool(**t) for t in tool_list()]

    @server.call_tool(validate_input=False)  # type: ignore[untyped-decorator]
    async def call_tool(name: str, arguments: dict[str, Any]) -> types.CallToolResult:
        request = server.request_context.request
        headers = getattr(request, "headers", None)
        token = bearer(headers.get("authorization") if headers is not None else None)
        try:
            outcome = await gateway.call_tool(AgentToken(token or ""), name, arguments)
        except AuthFailure as exc:
            text = json.dumps(exc.body())
            return types.CallToolResult(content=[types.TextContent(type="text", text=text)], isError=True)
        # The SDK serialises replies itself and answers 500 to one it cannot encode (a tool result can
        # carry text the gateway did not write, such as job logs): hand it only what encodes.
        return types.CallToolResult.model_validate(sanitized(mcp_call_result(outcome)))

    return server


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
