"""The HTTP side: routing, auth, request faults, the Jobs/bucket endpoints and the admin endpoints.

The server is the standard library's ThreadingHTTPServer, as verified against the real client in
`docs/hf-jobs-api.md`, because it gives exact control of the wire: responses are written with
`send_response_only`, so each carries exactly one `Date` header (a second one crashes the client's
log reader), and SSE bodies are chunk-encoded by hand.
"""

from __future__ import annotations

import contextlib
import hmac
import io
import json
import logging
import socket
import time
from email.utils import formatdate
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlencode, urlsplit

from devstack.hf_emulator import buckets, hub_api, records, routes, streams
from devstack.hf_emulator.errors import ApiError
from devstack.hf_emulator.faults import Fault
from devstack.hf_emulator.hardware import hardware_list

if TYPE_CHECKING:
    from devstack.hf_emulator.surface import Emulator

log = logging.getLogger(__name__)

HEALTH_PATH = "/_emulator/health"
MAX_BODY_BYTES = 16 << 20  # every body but a commit's (`HfEmulator.max_commit_bytes`)
MAX_DRAINED_BYTES = 1 << 30


class EmulatorServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], emulator: Emulator) -> None:
        self.emulator = emulator
        super().__init__(address, _Handler)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: EmulatorServer

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the request log is kept in memory (`HfEmulator.requests()`)."""

    def do_GET(self) -> None:
        self._dispatch()

    def do_POST(self) -> None:
        self._dispatch()

    def do_PUT(self) -> None:
        self._dispatch()

    def do_DELETE(self) -> None:
        self._dispatch()

    def do_HEAD(self) -> None:
        self._dispatch()

    # -- writing ------------------------------------------------------------------------------

    def _start(self, status: int, content_type: str, headers: dict[str, str] | None = None) -> None:
        # send_response_only: BaseHTTPRequestHandler.send_response would add a second Date header.
        self.send_response_only(status)
        self.send_header("Date", formatdate(usegmt=True))
        self.send_header("Content-Type", content_type)
        for k, v in (headers or {}).items():
            self.send_header(k, v)

    def _send(
        self,
        status: int,
        body: bytes,
        content_type: str = "application/json",
        headers: dict[str, str] | None = None,
    ) -> None:
        self._start(status, content_type, headers)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, data: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(data).encode(), headers=headers)

    def _error(self, status: int, message: str, headers: dict[str, str] | None = None, **extra: Any) -> None:
        self._json(status, {"error": message, **extra}, headers)

    def start_sse(self) -> None:
        self._start(200, "text/event-stream", {"Cache-Control": "no-cache", "Connection": "close"})
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        self.close_connection = True

    def chunk(self, data: bytes) -> None:
        self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
        self.wfile.flush()

    def end_chunks(self) -> None:
        self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()

    # -- dispatch -----------------------------------------------------------------------------

    def _dispatch(self) -> None:
        emu = self.server.emulator
        split = urlsplit(self.path)
        query = parse_qs(split.query, keep_blank_values=True)
        matched = routes.match(self.command, split.path)
        route = matched.key if matched else routes.unmatched(self.command)
        try:
            body = self._read_body(emu.max_commit_bytes if route == routes.COMMIT else MAX_BODY_BYTES)
            if split.path.startswith("/_emulator/"):
                # Health is for readiness probes; the rest registers host directories, injects
                # faults and serves the request log: only for whoever holds the token.
                if body is None or (split.path != HEALTH_PATH and not self._authorized(emu)):
                    return
                _admin(self, emu, split.path, query, body)
                return
            recorded = (body or b"")[: records.MAX_RECORDED_BODY_BYTES]
            emu.record_request(self.command, self.path, route, list(self.headers.items()), recorded)
            if body is None:
                return
            fault = emu.faults.take_request_fault(route)
            if fault is not None and fault.kind == "lose_response":
                # Process the request into a buffer nobody reads, then hang up without answering.
                real = self.wfile
                self.wfile = io.BytesIO()
                try:
                    self._serve(emu, matched, query, body)
                finally:
                    self.wfile = real
                self._hang_up()
                return
            if fault is not None and not self._apply_request_fault(emu, route, fault):
                return
            self._serve(emu, matched, query, body)
        except (BrokenPipeError, ConnectionResetError, TimeoutError):
            self.close_connection = True
        except Exception as exc:
            # An emulator bug must show up as a 500 the test can see, not as a dropped connection.
            log.exception("emulator error on %s %s", self.command, self.path)
            self.close_connection = True
            with contextlib.suppress(OSError):
                self._error(500, f"internal emulator error: {type(exc).__name__}: {exc}")

    def _serve(
        self, emu: Emulator, matched: routes.Match | None, query: dict[str, list[str]], body: bytes
    ) -> None:
        try:
            if matched is None or matched.key == routes.AGENT_HARNESSES:
                self._error(404, "Not Found")
                return
            if not self._authorized(emu):
                return
            _api(self, emu, matched, query, body)
        except ApiError as reply:
            self._error(reply.status, reply.message, reply.headers, **reply.extra)

    def _read_body(self, limit: int) -> bytes | None:
        """The request body, or None once a 400/413 has been sent for it."""
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if length < 0:
            self.close_connection = True
            self._error(400, "Content-Length must be a non-negative integer")
            return None
        if length <= limit:
            return self.rfile.read(length) if length else b""
        # Read what was sent before answering (up to a bound): a client cut off while it is still
        # sending sees a broken connection, which it retries, instead of the 413.
        self.close_connection = True
        remaining = length if length <= MAX_DRAINED_BYTES else 0
        while remaining > 0 and (chunk := self.rfile.read(min(1 << 20, remaining))):
            remaining -= len(chunk)
        message = f"Payload Too Large: the body is {length} bytes, more than the {limit} taken here"
        self._error(413, message, {"X-Error-Message": message})
        return None

    def _authorized(self, emu: Emulator) -> bool:
        """Whether the request carries the token; if not, a 401 has been sent."""
        given = self.headers.get("Authorization") or ""
        if hmac.compare_digest(given.encode(), f"Bearer {emu.token}".encode()):
            return True
        message = "Invalid credentials in Authorization header"
        self._error(401, message, {"X-Error-Message": message})
        return False

    def _hang_up(self) -> None:
        """Close without a byte of response: the client sees a protocol/connection error."""
        self.close_connection = True
        with contextlib.suppress(OSError):
            self.connection.shutdown(socket.SHUT_RDWR)

    def _apply_request_fault(self, emu: Emulator, route: str, fault: Fault) -> bool:
        """Apply a request fault; False if the request has been dealt with."""
        if fault.kind in ("delay", "hang"):
            emu.faults.hold(route, fault)
            return True
        if fault.kind == "drop":
            self._hang_up()
            return False
        if fault.kind == "rate_limit":
            reset = max(0, int(fault.seconds))
            self._error(
                429,
                "You have exceeded our rate limit",
                {
                    "RateLimit": f'"api";r=0;t={reset}',
                    "RateLimit-Policy": '"fixed window";"api";q=500;w=300',
                },
            )
            return False
        self._error(fault.status, fault.message)
        return False


def _int_param(query: dict[str, list[str]], name: str) -> int | None:
    if not query.get(name):
        return None
    try:
        return int(query[name][0])
    except ValueError as exc:
        raise ApiError(400, f"{name} must be an integer") from exc


def _base_url(handler: _Handler) -> str:
    host = handler.headers.get("Host") or "{}:{}".format(*handler.server.server_address[:2])
    return f"http://{host}"


def _link(handler: _Handler, query: dict[str, list[str]], cursor: str) -> str:
    params = [(k, v) for k, vs in query.items() if k != "cursor" for v in vs] + [("cursor", cursor)]
    path = urlsplit(handler.path).path
    return f'<{_base_url(handler)}{path}?{urlencode(params)}>; rel="next"'


def _api(h: _Handler, emu: Emulator, m: routes.Match, query: dict[str, list[str]], body: bytes) -> None:
    p = m.params
    if m.key == routes.WHOAMI:
        orgs = [{"name": o, "type": "org"} for o in emu.orgs]
        h._json(
            200,
            {"name": emu.namespace, "type": "user", "id": emu.owner_id, "fullname": "Emulator", "orgs": orgs},
        )
    elif m.key == routes.HARDWARE:
        h._json(200, hardware_list())
    elif m.key == routes.BILLING_USAGE:
        h._json(200, records.billing_usage(emu.billing()))
    elif m.key == routes.CREATE_JOB:
        try:
            payload = json.loads(body or b"null")
        except ValueError as exc:
            raise ApiError(400, "the body is not valid JSON") from exc
        h._json(200, emu.create_job(p["namespace"], payload))
    elif m.key == routes.LIST_JOBS:
        page, next_cursor = emu.list_jobs(p["namespace"], query, _int_param(query, "cursor"))
        headers = {"Link": _link(h, query, str(next_cursor))} if next_cursor is not None else None
        h._json(200, page, headers)
    elif m.key == routes.COUNT_JOBS:
        h._json(200, {"count": emu.count_jobs(p["namespace"], query)})
    elif m.key == routes.INSPECT_JOB:
        with emu.cond:
            wire = emu.visible_job(p["namespace"], p["job_id"]).to_wire(time.time())
        h._json(200, wire)
    elif m.key == routes.CANCEL_JOB:
        h._json(200, emu.cancel_job(p["namespace"], p["job_id"]))
    elif m.key == routes.JOB_LOGS:
        streams.stream_logs(h, emu, p["namespace"], p["job_id"], query)
    elif m.key == routes.JOB_METRICS:
        streams.stream_metrics(h, emu, p["namespace"], p["job_id"])
    elif m.key in routes.HUB_ROUTES:
        data, headers = hub_api.handle(emu, m, query, body, _base_url(h), lambda c: _link(h, query, c))
        h._json(200, data, headers)
    elif m.key in routes.FILE_ROUTES:
        path, headers = hub_api.resolve_file(emu, m)
        _send_file(h, path, headers)
    else:
        _serve_bucket(h, emu, m, query)


def _serve_bucket(h: _Handler, emu: Emulator, m: routes.Match, query: dict[str, list[str]]) -> None:
    p = m.params
    bucket_id = f"{p['namespace']}/{p['bucket']}"
    try:
        root = emu.bucket_path(bucket_id)
    except ValueError as exc:
        raise ApiError(400, str(exc)) from exc
    try:
        if m.key == routes.BUCKET_INFO:
            h._json(200, buckets.info(root, bucket_id))
        elif m.key in (routes.BUCKET_TREE, routes.BUCKET_TREE_ROOT):
            recursive = query.get("recursive", ["false"])[0].lower() == "true"
            items = buckets.tree(root, bucket_id, p.get("path", ""), recursive)
            offset = _int_param(query, "cursor") or 0
            page = items[offset : offset + emu.tree_page_size]
            more = offset + emu.tree_page_size < len(items)
            headers = {"Link": _link(h, query, str(offset + emu.tree_page_size))} if more else None
            h._json(200, page, headers)
        else:
            _send_file(h, buckets.resolve(root, bucket_id, p["path"]))
    except buckets.BucketError as exc:
        raise ApiError(exc.status, exc.message, {"X-Error-Code": exc.error_code}) from exc


def _send_file(h: _Handler, path: Path, extra_headers: dict[str, str] | None = None) -> None:
    size = path.stat().st_size
    byte_range = buckets.parse_range(h.headers.get("Range"), size)
    start, end, status = 0, size, 200
    headers = {"Accept-Ranges": "bytes", **(extra_headers or {})}
    if byte_range is not None:
        start, end = byte_range
        if start >= size and size > 0:
            raise ApiError(416, "Range Not Satisfiable", {"Content-Range": f"bytes */{size}"})
        status = 206
        headers["Content-Range"] = f"bytes {start}-{max(start, end - 1)}/{size}"
    h._start(status, "application/octet-stream", headers)
    h.send_header("Content-Length", str(end - start))
    h.end_headers()
    if h.command == "HEAD":
        return
    with path.open("rb") as f:
        f.seek(start)
        remaining = end - start
        while remaining > 0:
            chunk = f.read(min(1 << 20, remaining))
            if not chunk:
                break
            h.wfile.write(chunk)
            remaining -= len(chunk)


def _admin(h: _Handler, emu: Emulator, path: str, query: dict[str, list[str]], body: bytes) -> None:
    """Test/benchmark endpoints: not part of the HF API, not counted, not recorded; the same token."""
    method = h.command
    try:
        data = json.loads(body) if body else {}
    except ValueError:
        h._error(400, "the body is not valid JSON")
        return
    try:
        if (method, path) == ("GET", HEALTH_PATH):
            h._json(200, {"ok": True, "namespace": emu.namespace})
        elif (method, path) == ("GET", "/_emulator/stats"):
            creations = emu.all_creations()
            counts = emu.request_counts()
            h._json(
                200,
                {"requests": counts, "total": sum(counts.values()), "jobCreationsByLabel": creations},
            )
        elif (method, path) == ("POST", "/_emulator/stats/reset"):
            emu.reset_stats()
            h._json(200, {})
        elif (method, path) == ("GET", "/_emulator/requests"):
            h._json(200, [r.to_wire(emu.token) for r in emu.requests()])
        elif (method, path) == ("GET", "/_emulator/faults"):
            h._json(200, [f.to_wire() for f in emu.faults.active()])
        elif (method, path) == ("POST", "/_emulator/faults"):
            h._json(200, emu.controls.add_fault(Fault.from_wire(data)).to_wire())
        elif (method, path) == ("DELETE", "/_emulator/faults"):
            emu.controls.clear_faults()
            h._json(200, {})
        elif (method, path) == ("POST", "/_emulator/faults/release"):
            emu.controls.release_hangs()
            h._json(200, {})
        elif (method, path) == ("GET", "/_emulator/billing"):
            records = emu.billing()
            h._json(
                200,
                {
                    "jobs": [r.to_wire() for r in records],
                    "totalMinutes": sum(r.minutes for r in records),
                    "totalMicroUsd": sum(r.cost_micro_usd for r in records),
                },
            )
        elif (method, path) == ("GET", "/_emulator/jobs"):
            h._json(200, emu.jobs())
        elif (method, path) == ("POST", "/_emulator/repos"):
            target = emu.repos.register(data["kind"], data["repoId"], data.get("revision"), data["sourceDir"])
            h._json(200, {"path": str(target)})
        elif (method, path) == ("POST", "/_emulator/buckets"):
            h._json(200, {"path": str(emu.create_bucket(data["id"]))})
        else:
            h._error(404, f"no admin endpoint {method} {path}")
    except (KeyError, TypeError, ValueError, OSError) as exc:
        h._error(400, f"{type(exc).__name__}: {exc}")
