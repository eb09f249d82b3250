"""Who the caller is: the orchestrator (the one shared token), or the agent of one Episode (the Episode
whose agentTokenHash is the sha256 of its bearer token). Transports ask here before anything else;
what a caller may then do to its episode is `episodes.Episodes`'s business."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
from typing import Any

from posttrain_operator.api.rules import stored_token_hash, token_hash
from starlette.datastructures import Headers

from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeView
from env_gateway.kube import Kube
from env_gateway.metrics import GatewayMetrics
from env_gateway.parsed_views import parse_episode

MAX_TOKEN_CHARS = 512


class AuthFailure(Exception):
    """401: no or unknown credential; 403: a valid credential on the wrong surface or episode."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


def bearer(header: str | None) -> str | None:
    if not header or len(header) > MAX_TOKEN_CHARS + 10:
        return None
    scheme, _, value = header.partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


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


class Authenticator:
    """Checks credentials, and issues the agent tokens `reset` hands to the orchestrator."""

    def __init__(self, settings: GatewaySettings, kube: Kube, metrics: GatewayMetrics | None = None) -> None:
        self.settings = settings
        self.kube = kube
        self.metrics = metrics or GatewayMetrics()
        self._by_hash: dict[str, str] = {}  # sha256(token) -> episode name, learned from lists

    def is_orchestrator(self, token: str | None) -> bool:
        expected = self.settings.orchestrator_token.get_secret_value().encode()
        return token is not None and hmac.compare_digest(token.encode(), expected)

    def require_orchestrator(self, token: str | None) -> None:
        try:
            self._require_orchestrator(token)
        except AuthFailure:
            self.metrics.refused_auth()
            raise

    def _require_orchestrator(self, token: str | None) -> None:
        if token is None:
            raise AuthFailure(
                401, "missing_token", "this surface needs `Authorization: Bearer <orchestrator token>`"
            )
        if not self.is_orchestrator(token):
            raise AuthFailure(401, "invalid_token", "not the orchestrator token")

    async def agent_episode(self, token: str | None) -> EpisodeView:
        """The one Episode whose agentTokenHash is sha256(token), compared in constant time."""
        try:
            return await self._agent_episode(token)
        except AuthFailure:
            self.metrics.refused_auth()
            raise

    async def _agent_episode(self, token: str | None) -> EpisodeView:
        if token is None:
            raise AuthFailure(
                401, "missing_token", "the agent surface needs `Authorization: Bearer <agent token>`"
            )
        if self.is_orchestrator(token):
            raise AuthFailure(403, "wrong_surface", "the orchestrator token is not an agent token")
        digest = token_hash(token)
        name = self._by_hash.get(digest)
        if name is not None:
            body = await self.kube.get_episode(self.settings.namespace, name)
            if body is not None and _matches(body, digest):
                return parse_episode(body)
            self._by_hash.pop(digest, None)
        matches = [b for b in await self.kube.list_episodes(self.settings.namespace) if _matches(b, digest)]
        if not matches:  # an Episode made a moment ago elsewhere may not be in the mirror yet
            listed = await self.kube.list_episodes(self.settings.namespace, fresh=True)
            matches = [b for b in listed if _matches(b, digest)]
        if len(matches) != 1:
            # Zero: unknown or revoked. Several: refuse rather than guess (a token binds to one episode).
            raise AuthFailure(401, "invalid_token", "the token belongs to no episode")
        self._by_hash[digest] = matches[0]["metadata"]["name"]
        return parse_episode(matches[0])

    @staticmethod
    def new_agent_token() -> str:
        return secrets.token_urlsafe(32)

    def issued(self, token: str, episode: str) -> None:
        """`token` is the agent token of the Episode `episode` just made: its first call needs no list."""
        self._by_hash[token_hash(token)] = episode


def _matches(body: dict[str, Any], digest: str) -> bool:
    stored = stored_token_hash(body)
    return stored is not None and hmac.compare_digest(stored.encode(), digest.encode())
