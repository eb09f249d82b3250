"""The gateway app: `create_app(settings)`; run with
`uvicorn --factory env_gateway.main:app_from_env` (settings from `GATEWAY_*`)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

from fastapi import FastAPI, WebSocket
from starlette.routing import Route

from env_gateway import __version__
from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.gateway import Gateway
from env_gateway.kube import Kube, make_api_client
from env_gateway.mcp_sdk import build_session_manager
from env_gateway.openenv import HybridMcp, OrchestratorSocket, Sessions
from env_gateway.wire import ACTION_SCHEMA, OBSERVATION_SCHEMA, RESET_OBSERVATION_SCHEMA, STATE_SCHEMA

DESCRIPTION = (
    "posttrain-operator: an agent post-trains a model under a dollar budget by submitting batch jobs; "
    "the reward is the hidden-split score of its submission."
)


class _Late:
    """The gateway exists only once the lifespan has a Kubernetes client; routes are bound before."""

    gateway: Gateway


def create_app(settings: GatewaySettings, kube: Kube | None = None) -> FastAPI:
    holder = _Late()
    sessions = Sessions(settings.max_sessions)
    # The SDK's session manager needs its server at construction; the server needs the gateway, which
    # needs the Kubernetes client made in the lifespan. So the tool handlers reach it through `holder`.
    gateway_proxy: Any = _GatewayProxy(holder)
    sdk = build_session_manager(gateway_proxy, settings)
    hybrid = HybridMcp(gateway_proxy, sessions, sdk)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        own_kube = kube is None
        k = kube or Kube(await make_api_client(settings.kubeconfig))
        broker = BrokerClient(settings.broker_url, settings.broker_token_file)
        holder.gateway = Gateway(settings, k, broker)
        try:
            # The host app owns the lifespan: a mounted sub-app's lifespan would never run.
            async with sdk.run():
                yield
        finally:
            await broker.close()
            if own_kube:
                await k.close()

    app = FastAPI(title="posttrain env gateway", version=__version__, lifespan=lifespan)
    app.router.routes.append(Route("/mcp", endpoint=hybrid, methods=["GET", "POST", "DELETE"]))

    @app.get("/health", tags=["openenv"])
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata", tags=["openenv"])
    async def metadata() -> dict[str, Any]:
        return {
            "name": "posttrain_env",
            "description": DESCRIPTION,
            "readme_content": None,
            "version": __version__,
            "author": "posttrain-operator",
            "documentation_url": None,
        }

    @app.get("/schema", tags=["openenv"])
    async def schema() -> dict[str, Any]:
        return {
            "action": ACTION_SCHEMA,
            "observation": OBSERVATION_SCHEMA,
            "state": STATE_SCHEMA,
            "reset_observation": RESET_OBSERVATION_SCHEMA,
        }

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await OrchestratorSocket(holder.gateway, sessions, websocket).run()

    return app


class _GatewayProxy:
    def __init__(self, holder: _Late) -> None:
        self._holder = holder

    def __getattr__(self, name: str) -> Any:
        return getattr(self._holder.gateway, name)


def app_from_env() -> FastAPI:
    return create_app(GatewaySettings())  # filled from GATEWAY_* env
