"""The operator's internal broker API: job logs and artifact listings, which need the backend
credential that only the operator holds.

Callers authenticate with a bearer token, which the broker checks with a TokenReview. The gateway's
ServiceAccount (an allow-list of usernames) may read any job; anyone else (a person, with
`posttrain logs`) only jobs in namespaces where RBAC lets them get AgentJobs, as a
SubjectAccessReview for their own identity decides. Every answer is bounded.

    GET /healthz
    GET /v1/namespaces/{namespace}/agentjobs/{name}/logs?tail=N   -> {"lines": [...], "truncated": bool}
    GET /v1/namespaces/{namespace}/agentjobs/{name}/artifacts     -> {"artifacts": [{"path", "size"}]}
    GET /v1/namespaces/{namespace}/agentjobs/{name}/artifact?path=P -> {"path", "size", "text"}

One artifact is read only if it is a regular UTF-8 text file of at most MAX_ARTIFACT_BYTES under the
job's outputs: a path that leaves them (absolute, `..`, empty parts) is 400, a file that is missing
is 404, and one that is a link, not a file, too large or not text is 422, each with the reason.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from aiohttp import web

from posttrain_operator.api.models import AgentJobStatus, status_of
from posttrain_operator.backends.base import BackendError
from posttrain_operator.k8s import Identity
from posttrain_operator.reconcile.context import CREDENTIAL_REASONS, Context
from posttrain_operator.reconcile.jobs import handle_of

log = logging.getLogger(__name__)

MAX_TAIL = 1000
MAX_LINE_CHARS = 4096
MAX_LOG_CHARS = 256 * 1024
MAX_ARTIFACT_BYTES = 256 * 1024
MAX_ARTIFACT_PATH_CHARS = 1024
TOKEN_CACHE_SECONDS = 60.0
CTX_KEY = web.AppKey("ctx", Context)
REVIEWS_KEY = web.AppKey("reviews", dict)


async def _authorized(request: web.Request, namespace: str) -> Identity:
    header = request.headers.get("Authorization", "")
    if not header.startswith("Bearer ") or len(header) > 8192:
        raise web.HTTPUnauthorized(text='{"error": "a bearer token is required"}')
    token = header.removeprefix("Bearer ").strip()
    ctx = request.app[CTX_KEY]
    reviews: dict[str, tuple[float, Identity | None]] = request.app[REVIEWS_KEY]
    cached = reviews.get(token)
    if cached is None or time.monotonic() - cached[0] > TOKEN_CACHE_SECONDS:
        who = await ctx.kube.review_token(token)
        if len(reviews) > 1000:
            reviews.clear()
        reviews[token] = cached = (time.monotonic(), who)
    who = cached[1]
    if who is None:
        raise web.HTTPUnauthorized(text='{"error": "token rejected by TokenReview"}')
    if who.username in ctx.settings.broker_allowed_users:
        return who
    # Not cached: a RoleBinding removed takes effect on the next request.
    if not await ctx.kube.may(who, "get", "agentjobs", namespace):
        raise web.HTTPForbidden(
            text=json.dumps({"error": f"{who.username} may not get agentjobs in namespace {namespace}"})
        )
    return who


async def _job(request: web.Request) -> tuple[Context, dict[str, Any], AgentJobStatus]:
    namespace, name = request.match_info["namespace"], request.match_info["name"]
    await _authorized(request, namespace)
    ctx = request.app[CTX_KEY]
    job = await ctx.kube.get_agentjob(namespace, name)
    if job is None:
        raise web.HTTPNotFound(text='{"error": "no such AgentJob"}')
    return ctx, job, status_of(AgentJobStatus, job.get("status"))


async def logs(request: web.Request) -> web.Response:
    ctx, job, status = await _job(request)
    try:
        tail = int(request.query.get("tail", "100"))
    except ValueError:
        raise web.HTTPBadRequest(text='{"error": "tail must be an integer"}') from None
    if not 1 <= tail <= MAX_TAIL:
        raise web.HTTPBadRequest(text=f'{{"error": "tail must be between 1 and {MAX_TAIL}"}}')
    handle = handle_of(job, status)
    if handle is None or status.backend is None:
        return web.json_response({"lines": [], "truncated": False})
    try:
        raw = await ctx.backend(status.backend).logs(handle, tail)
    except BackendError as exc:
        raise web.HTTPBadGateway(text=f'{{"error": "backend: {str(exc)[:200]}"}}') from exc
    lines, total, truncated = [], 0, False
    for line in reversed(raw[-tail:]):
        clipped = line[:MAX_LINE_CHARS]
        if total + len(clipped) > MAX_LOG_CHARS:
            truncated = True
            break
        truncated = truncated or len(clipped) < len(line)
        lines.append(clipped)
        total += len(clipped)
    return web.json_response({"lines": lines[::-1], "truncated": truncated})


async def artifacts(request: web.Request) -> web.Response:
    ctx, job, status = await _job(request)
    handle = handle_of(job, status)
    if handle is None or status.backend is None:
        return web.json_response({"artifacts": []})
    try:
        found = await ctx.backend(status.backend).artifacts(handle.output_prefix)
    except BackendError as exc:
        raise web.HTTPBadGateway(text=f'{{"error": "backend: {str(exc)[:200]}"}}') from exc
    return web.json_response({"artifacts": [{"path": a.path, "size": a.size} for a in found[:1000]]})


def _error(kind: type[web.HTTPException], message: str) -> web.HTTPException:
    return kind(text=json.dumps({"error": message}), content_type="application/json")


def artifact_path_error(path: str) -> str | None:
    """Why `path` does not name a file inside a job's outputs, or None when it does."""
    if not path or len(path) > MAX_ARTIFACT_PATH_CHARS:
        return f"the path must have 1 to {MAX_ARTIFACT_PATH_CHARS} characters"
    if path.startswith("/"):
        return "the path must be relative to the job's outputs, not absolute"
    if any(part in ("", ".", "..") for part in path.split("/")) or "\x00" in path:
        return "the path must not contain '..', '.', empty parts or NUL"
    return None


async def artifact(request: web.Request) -> web.Response:
    ctx, job, status = await _job(request)
    path = request.query.get("path", "")
    problem = artifact_path_error(path)
    if problem:
        raise _error(web.HTTPBadRequest, problem)
    handle = handle_of(job, status)
    if handle is None or status.backend is None:
        raise _error(web.HTTPNotFound, "the job has no outputs yet")
    try:
        data = await ctx.backend(status.backend).read_artifact(handle.output_prefix, path, MAX_ARTIFACT_BYTES)
    except FileNotFoundError:
        raise _error(web.HTTPNotFound, f"no file {path!r} in the job's outputs") from None
    except BackendError as exc:
        kind = web.HTTPBadGateway if exc.transient else web.HTTPUnprocessableEntity
        raise _error(kind, str(exc)[:300]) from exc
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _error(web.HTTPUnprocessableEntity, f"{path!r} is not UTF-8 text") from None
    return web.json_response({"path": path, "size": len(data), "text": text})


async def healthz(request: web.Request) -> web.Response:
    """Ready unless a backend's credentials are refused or missing (a transient outage is not a
    reason to take the operator out of its Service); each backend's last check in the body."""
    ctx = request.app[CTX_KEY]
    backends = {
        name: {"ok": h.ok, "reason": h.reason, "message": h.message} for name, h in ctx.health.items()
    }
    refused = [name for name, h in ctx.health.items() if h.reason in CREDENTIAL_REASONS]
    # A standby is ready too (its broker only reads), so rollouts and `helm --wait` complete.
    role = "standby" if ctx.standby else "leader"
    body = {"status": "unavailable" if refused else "ok", "role": role, "backends": backends}
    return web.json_response(body, status=503 if refused else 200)


async def livez(_: web.Request) -> web.Response:
    """Alive, leader or standby (kopf's own liveness endpoint starts only once this one leads)."""
    return web.json_response({"status": "alive"})


def make_app(ctx: Context) -> web.Application:
    app = web.Application(client_max_size=64 * 1024)
    app[CTX_KEY] = ctx
    app[REVIEWS_KEY] = {}
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", livez)
    app.router.add_get("/v1/namespaces/{namespace}/agentjobs/{name}/logs", logs)
    app.router.add_get("/v1/namespaces/{namespace}/agentjobs/{name}/artifacts", artifacts)
    app.router.add_get("/v1/namespaces/{namespace}/agentjobs/{name}/artifact", artifact)
    return app


async def serve(ctx: Context) -> web.AppRunner:
    runner = web.AppRunner(make_app(ctx), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, ctx.settings.broker_host, ctx.settings.broker_port)
    await site.start()
    log.info("broker API listening on %s:%d", ctx.settings.broker_host, ctx.settings.broker_port)
    return runner
