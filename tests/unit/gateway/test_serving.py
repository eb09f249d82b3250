"""How the app is served: the hot path past FastAPI's stack, the access log's lines, FastAPI's
telemetry, the metrics' series and the headers `/mcp` reads."""

from __future__ import annotations

import logging
import logging.config
from collections.abc import Iterator
from typing import Any

import opentelemetry.trace
import pytest
from starlette.datastructures import Headers
from starlette.testclient import TestClient
from starlette.types import Receive, Scope, Send
from uvicorn.config import LOGGING_CONFIG
from uvicorn.logging import AccessFormatter

from env_gateway import main
from env_gateway.config import GatewaySettings
from env_gateway.http_mcp import read_headers
from env_gateway.metrics import GatewayMetrics

SETTINGS = GatewaySettings(namespace="ns", orchestrator_token="orchestrator-token")  # type: ignore[arg-type]


@pytest.fixture
def access_log() -> Iterator[logging.Handler]:
    """uvicorn's default logging configuration, as `python -m uvicorn` installs it."""
    logging.config.dictConfig(LOGGING_CONFIG)
    handler = logging.getLogger("uvicorn.access").handlers[0]
    yield handler
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):
        logging.getLogger(name).handlers.clear()


def access_record(status: int, path: str = "/mcp") -> logging.LogRecord:
    args = ("127.0.0.1:5000", "POST", path, "1.1", status)
    message = '%s - "%s %s HTTP/%s" %d'
    return logging.LogRecord("uvicorn.access", logging.INFO, __file__, 1, message, args, None)


@pytest.mark.parametrize("use_colors", [False, True])
def test_the_access_lines_are_uvicorns_own_without_copying_records(
    access_log: logging.Handler, use_colors: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    formatter = access_log.formatter
    assert type(formatter) is AccessFormatter
    formatter.use_colors = use_colors  # type: ignore[attr-defined]
    records = [access_record(s) for s in (200, 202, 401, 404, 413, 500, 799)] + [access_record(200, "/a?b=1")]
    want = [formatter.format(r) for r in records]
    with main._serving_process():
        assert type(formatter) is main._AccessLine
        if not use_colors:  # a coloured line (a terminal) is uvicorn's, copies and all
            monkeypatch.setattr("uvicorn.logging.copy", lambda _: pytest.fail("a record was copied"))
        assert [formatter.format(r) for r in records] == want
    assert want[0] == 'INFO:     127.0.0.1:5000 - "POST /mcp HTTP/1.1" 200 OK' or use_colors


def test_a_custom_access_formatter_is_left_alone(access_log: logging.Handler) -> None:
    custom = logging.Formatter("%(message)s")
    access_log.setFormatter(custom)
    with main._serving_process():
        assert access_log.formatter is custom and type(custom) is logging.Formatter


def test_fastapi_looks_for_no_telemetry_provider_per_request(monkeypatch: pytest.MonkeyPatch) -> None:
    def looked(*_: Any) -> Any:
        raise AssertionError("a request looked for a tracer provider")

    monkeypatch.setattr(opentelemetry.trace, "get_tracer_provider", looked)
    client = TestClient(main.create_app(SETTINGS))  # no lifespan: /health needs none
    assert client.get("/health").json() == {"status": "healthy"}


def test_post_mcp_skips_fastapis_stack_and_a_failure_is_still_a_timed_500(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    seen: list[Scope] = []

    async def failing(self: object, scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope)
        raise RuntimeError("the handler failed")

    monkeypatch.setattr(main._Mcp, "__call__", failing)
    client = TestClient(main.create_app(SETTINGS), raise_server_exceptions=False)
    answer = client.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
    assert (answer.status_code, answer.text) == (500, "Internal Server Error")  # as FastAPI's stack
    assert "router" not in seen[-1]  # Starlette's router never saw it
    assert client.get("/mcp").status_code == 500
    assert "router" in seen[-1]  # other methods go through FastAPI, as before
    exposition = client.get("/metrics").text
    assert 'request_duration_seconds_count{method="POST",route="/mcp",status="500"} 1.0' in exposition
    assert 'request_duration_seconds_count{method="GET",route="/mcp",status="500"} 1.0' in exposition


def test_a_series_is_looked_up_once_and_counts_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    metrics = GatewayMetrics(frozenset({"jobs_status"}))
    looked: list[tuple[str, ...]] = []
    for metric in (metrics.tool_calls, metrics.tool_seconds, metrics.request_seconds):
        labels = metric.labels

        def counting(*values: str, _labels: Any = labels) -> Any:
            looked.append(values)
            return _labels(*values)

        monkeypatch.setattr(metric, "labels", counting)
    for _ in range(3):
        metrics.called("jobs_status", None, 0.01)
        metrics.request("/mcp", "POST", "200", 0.01)
    assert looked == [("jobs_status", "ok"), ("jobs_status",), ("/mcp", "POST", "200")]
    metrics.called("no-such-tool", None, 0.01)
    metrics.called("no-such-tool-either", None, 0.01)  # caller-chosen names are not kept
    assert len(looked) == 7
    exposition = metrics.exposition().decode()
    assert 'posttrain_gateway_tool_calls_total{result="ok",tool="jobs_status"} 3.0' in exposition
    assert 'posttrain_gateway_tool_calls_total{result="ok",tool="unknown"} 2.0' in exposition
    assert 'request_duration_seconds_count{method="POST",route="/mcp",status="200"} 3.0' in exposition


def test_mcp_reads_the_first_value_of_each_header_it_decides_on() -> None:
    raw = [(b"host", b"a:1"), (b"authorization", b"Bearer x"), (b"host", b"b:2"), (b"x-other", b"y")]
    scope: Scope = {"type": "http", "headers": raw}
    headers = Headers(raw=list(raw))
    got = read_headers(scope)
    assert got == {b"host": "a:1", b"authorization": "Bearer x"}
    for name in ("host", "authorization", "mcp-session-id", "mcp-protocol-version"):
        assert got.get(name.encode()) == headers.get(name)
