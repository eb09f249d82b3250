"""What the gateway's transports share (HTTP `/mcp` and `/ws`), so neither imports the other: the
body limit, the JSON reply, and the Host rule."""

from __future__ import annotations

from typing import Any

from starlette.responses import Response

from env_gateway.codec import encode_json

MAX_BODY_BYTES = 1024 * 1024


class JsonReply(Response):
    """A JSON response through the one encoder: it renders whatever the reply carries."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return encode_json(content)


def host_allowed(host: str | None, patterns: list[str]) -> bool:
    """The MCP SDK's DNS-rebinding rule (exact, or `name:*` for any port), for the paths it doesn't serve."""
    if not host:
        return False
    return any(host == p or (p.endswith(":*") and host.startswith(p[:-1])) for p in patterns)
