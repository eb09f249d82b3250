"""The gateway app: `create_app(settings)`; run with
`uvicorn --factory env_gateway.main:app_from_env` (settings from `GATEWAY_*`)."""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any

from fastapi import Depends, FastAPI, Response, WebSocket
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from env_gateway import __version__
from env_gateway.config import GatewaySettings
from env_gateway.gateway import Gateway, open_gateway
from env_gateway.http_mcp import HybridMcp
from env_gateway.kube import Kube
from env_gateway.mcp_sdk import build_session_manager
from env_gateway.metrics import ROUTES, GatewayMetrics
from env_gateway.sessions import Sessions
from env_gateway.tools import TOOLS
from env_gateway.wire import ACTION_SCHEMA, OBSERVATION_SCHEMA, RESET_OBSERVATION_SCHEMA, STATE_SCHEMA
from env_gateway.ws import OrchestratorSocket

DESCRIPTION = (
    "posttrain-operator: an agent post-trains a model under a dollar budget by submitting batch jobs; "
    "the reward is the hidden-split score of its submission."
)


@dataclass(frozen=True)
class Serving:
    """What the routes serve with, built by the lifespan once it has a Kubernetes client (the gateway,
    and the MCP session manager, which needs its server, which needs the gateway, at construction)."""

    gateway: Gateway
    mcp: HybridMcp
    sessions: Sessions


def serving(conn: HTTPConnection) -> Serving:
    """The routes' dependency: the lifespan state (Starlette hands it to every request)."""
    state = getattr(conn.state, "serving", None)
    if not isinstance(state, Serving):  # only without the lifespan, i.e. a wiring bug
        raise RuntimeError("the gateway is served without its lifespan")
    return state


class _Mcp:
    """`/mcp`: the lifespan's HybridMcp. An ASGI app, hence a class: Starlette calls a function
    endpoint with a Request and wants a Response back."""

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await serving(HTTPConnection(scope)).mcp(scope, receive, send)


class _Timed:
    """Times every HTTP request by route (the app's own paths; anything else is `other`), method and
    status. A plain ASGI wrapper: it leaves streamed responses streaming."""

    def __init__(self, app: ASGIApp, metrics: GatewayMetrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started, status = time.monotonic(), "500"

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = str(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            route = scope["path"] if scope["path"] in ROUTES else "other"
            method = scope["method"] if scope["method"] in ("GET", "POST", "DELETE") else "other"
            self.metrics.request_seconds.labels(route, method, status).observe(time.monotonic() - started)


@contextlib.contextmanager
def _frozen_heap() -> Iterator[None]:
    """What the process built to serve (modules, schemas, models, the mirrored namespace as listed),
    out of the cyclic garbage collector's reach while it serves: those objects live as long as the app,
    and a full collection walked them all (about a tenth of a tool call's CPU). Reference counting
    frees them as before; only cycles among them wait for the unfreeze."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def create_app(settings: GatewaySettings, kube: Kube | None = None) -> FastAPI:
    sessions = Sessions(settings.max_sessions)
    metrics = GatewayMetrics(frozenset(TOOLS))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Serving]]:
        async with open_gateway(settings, kube, metrics) as gateway:
            sdk = build_session_manager(gateway, settings)
            # The host app owns the lifespan: a mounted sub-app's lifespan would never run.
            async with sdk.run():
                with _frozen_heap():
                    yield {"serving": Serving(gateway, HybridMcp(gateway, sessions, sdk), sessions)}

    app = FastAPI(title="posttrain env gateway", version=__version__, lifespan=lifespan)

    app.router.routes.append(Route("/mcp", endpoint=_Mcp(), methods=["GET", "POST", "DELETE"]))

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

    @app.get("/metrics", tags=["operations"], include_in_schema=False)
    async def prometheus() -> Response:
        return Response(metrics.exposition(), media_type=CONTENT_TYPE_LATEST)

    app.add_middleware(_Timed, metrics=metrics)

    @app.get("/schema", tags=["openenv"])
    async def schema() -> dict[str, Any]:
        return {
            "action": ACTION_SCHEMA,
            "observation": OBSERVATION_SCHEMA,
            "state": STATE_SCHEMA,
            "reset_observation": RESET_OBSERVATION_SCHEMA,
        }

    @app.websocket("/ws")
    async def ws(websocket: WebSocket, served: Annotated[Serving, Depends(serving)]) -> None:
        await OrchestratorSocket(served.gateway, served.sessions, websocket).run()

    return app


def app_from_env() -> FastAPI:
    return create_app(GatewaySettings())  # filled from GATEWAY_* env
