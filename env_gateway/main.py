"""The gateway app: `create_app(settings)`; run with
`uvicorn --factory env_gateway.main:app_from_env` (settings from `GATEWAY_*`)."""

from __future__ import annotations

import contextlib
import gc
import logging
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Annotated, Any, cast

from fastapi import Depends, FastAPI, Response, WebSocket
from fastapi.telemetry import TelemetryConfig
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.requests import HTTPConnection
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send
from uvicorn.logging import AccessFormatter

from env_gateway import __version__
from env_gateway.config import GatewaySettings
from env_gateway.gateway import Gateway, open_gateway
from env_gateway.http_mcp import HybridMcp
from env_gateway.kube import Kube
from env_gateway.logs import use_json_lines
from env_gateway.mcp_sdk import build_session_manager
from env_gateway.metrics import ROUTES, GatewayMetrics
from env_gateway.sessions import Sessions
from env_gateway.tools import TOOLS
from env_gateway.wire import ACTION_SCHEMA, OBSERVATION_SCHEMA, RESET_OBSERVATION_SCHEMA, STATE_SCHEMA
from env_gateway.ws import OrchestratorSocket

NO_TELEMETRY: TelemetryConfig = {"tracing": False, "metrics": False, "logs": False}

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
            self.metrics.request(route, method, status, time.monotonic() - started)


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


# What uvicorn logs an access with: client address, method, path and query, HTTP version, status.
AccessArgs = tuple[str, str, str, str, int]


class _AccessLine(AccessFormatter):
    """uvicorn's access line, the same text, without the two copies of every record that uvicorn's
    formatter and its base make to add the line's fields (the chart runs with the access log on, and
    those copies cost more than the rest of the line's formatting). Coloured lines (a terminal) are
    left to uvicorn."""

    _phrases: dict[int, str] = {}  # "200 OK", by status

    def formatMessage(self, record: logging.LogRecord) -> str:
        if self.use_colors:
            return super().formatMessage(record)
        client_addr, method, full_path, http_version, status_code = cast(AccessArgs, record.args)
        status = self._phrases.get(status_code)
        if status is None:
            status = self._phrases[status_code] = self.get_status_code(int(status_code))
        fields = _Fields()
        fields.__dict__ = record.__dict__ | {
            "client_addr": client_addr,
            "request_line": f"{method} {full_path} HTTP/{http_version}",
            "status_code": status,
            "levelprefix": record.levelname + ":" + " " * (8 - len(record.levelname)),
        }
        return logging.Formatter.formatMessage(self, fields)  # type: ignore[arg-type]


class _Fields:
    """What a format string reads: a record's attributes and the access line's, in one dict."""


def _access_lines_without_copies() -> None:
    """uvicorn's own access formatter (as its default logging configuration installs it; a custom
    `--log-config` is left alone) becomes `_AccessLine`, which writes the same lines."""
    for handler in logging.getLogger("uvicorn.access").handlers:
        if type(handler.formatter) is AccessFormatter:
            handler.formatter.__class__ = _AccessLine


@contextlib.contextmanager
def _serving_process() -> Iterator[None]:
    """The process as the app serves: uvicorn has configured logging (the lifespan runs after it)."""
    _access_lines_without_copies()
    with _frozen_heap():
        yield


class _Routes:
    """The app uvicorn serves. `POST /mcp`, the agents' every call, goes straight to its handler, timed,
    and with a failure answered 500 as by FastAPI's own stack (its `ServerErrorMiddleware`); everything
    else (the lifespan, `/ws`, the other routes, other methods, a request under a root path) goes to
    FastAPI, which serves `/mcp` too. The layers skipped do nothing for that route: it raises no
    HTTPException, has no dependencies, FastAPI sets it no body limit (its own is checked as it reads),
    and telemetry is off; passing them cost about a twentieth of a call's CPU."""

    def __init__(self, app: FastAPI, mcp: ASGIApp) -> None:
        self.app = app
        self.mcp = mcp

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["path"] == "/mcp"
            and scope["method"] == "POST"
            and not scope.get("root_path")
        ):
            await self.mcp(scope, receive, send)
        else:
            await self.app(scope, receive, send)


def create_app(settings: GatewaySettings, kube: Kube | None = None) -> _Routes:
    sessions = Sessions(settings.max_sessions)
    metrics = GatewayMetrics(frozenset(TOOLS))

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[dict[str, Serving]]:
        async with open_gateway(settings, kube, metrics) as gateway:
            sdk = build_session_manager(gateway, settings)
            # The host app owns the lifespan: a mounted sub-app's lifespan would never run.
            async with sdk.run():
                with _serving_process():
                    yield {"serving": Serving(gateway, HybridMcp(gateway, sessions, sdk), sessions)}

    # FastAPI's native OpenTelemetry is off: the gateway's metrics are its Prometheus registry, and
    # with telemetry on FastAPI looks for a configured provider on every request.
    app = FastAPI(
        title="posttrain env gateway", version=__version__, lifespan=lifespan, telemetry=NO_TELEMETRY
    )

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

    return _Routes(app, ServerErrorMiddleware(_Timed(_Mcp(), metrics)))


def app_from_env() -> _Routes:
    settings = GatewaySettings()  # filled from GATEWAY_* env
    if settings.log_format == "json":  # uvicorn configured its logging before calling this factory
        use_json_lines()
    return create_app(settings)
