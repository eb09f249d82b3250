"""The gateway's Prometheus metrics, in one registry per app.

Labels are bounded: tool names from the registry (anything else is `unknown`), error codes and
refusal reasons from fixed sets, and routes from the app's own paths; never an episode or a token.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

# Error codes of a tool call that refuse it before it does anything, by the reason they count as.
REFUSAL_REASONS = {
    "step_limit_reached": "step_limit",
    "time_limit_reached": "time_limit",
    "budget_exceeded": "budget",
    "quota_exceeded": "budget",
    "not_in_quota": "validation",
    "invalid_arguments": "validation",
    "invalid_job": "validation",
    "invalid_submission": "validation",
    "unknown_tool": "validation",
    "episode_done": "episode_done",
}
ROUTES = frozenset({"/mcp", "/health", "/metadata", "/schema", "/metrics"})
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)

Scope = dict[str, Any]
Message = dict[str, Any]
App = Callable[
    [Scope, Callable[[], Awaitable[Message]], Callable[[Message], Awaitable[None]]], Awaitable[None]
]


class GatewayMetrics:
    def __init__(self, tools: frozenset[str] = frozenset()) -> None:
        self.tools = tools
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.tool_calls = Counter(
            "posttrain_gateway_tool_calls",
            "Tool calls through the choke point, by tool and result (ok, or the error code)",
            ["tool", "result"],
            registry=r,
        )
        self.tool_seconds = Histogram(
            "posttrain_gateway_tool_call_duration_seconds",
            "Tool calls' duration, limits and step count included",
            ["tool"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.refusals = Counter(
            "posttrain_gateway_refusals",
            "Requests refused, by reason (auth, step_limit, time_limit, budget, validation, episode_done)",
            ["reason"],
            registry=r,
        )
        self.request_seconds = Histogram(
            "posttrain_gateway_request_duration_seconds",
            "HTTP requests' duration by route, method and status",
            ["route", "method", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        for reason in sorted({"auth", *REFUSAL_REASONS.values()}):
            self.refusals.labels(reason)  # present at 0, so a first refusal shows in rate()
        # The labelled series as `labels()` returns them, by their labels: `labels()` checks them
        # and takes a lock on every call, and every request records one or two (the label sets are
        # bounded, see above; nothing here removes a series).
        self._calls: dict[tuple[str, str | None], tuple[Any, Any]] = {}
        self._requests: dict[tuple[str, str, str], Any] = {}

    def tool_label(self, name: str) -> str:
        return name if name in self.tools else "unknown"

    def called(self, name: str, error_code: str | None, seconds: float) -> None:
        series = self._calls.get((name, error_code))
        if series is None:
            tool = self.tool_label(name)
            series = (self.tool_calls.labels(tool, error_code or "ok"), self.tool_seconds.labels(tool))
            if tool != "unknown":  # the caller's name is kept only when it is one of the tools
                self._calls[(name, error_code)] = series
        series[0].inc()
        series[1].observe(seconds)
        if error_code is not None and error_code in REFUSAL_REASONS:
            self.refusals.labels(REFUSAL_REASONS[error_code]).inc()

    def request(self, route: str, method: str, status: str, seconds: float) -> None:
        """One HTTP request; the labels must be bounded (the app's routes and methods, a status)."""
        series = self._requests.get((route, method, status))
        if series is None:
            series = self._requests[(route, method, status)] = self.request_seconds.labels(
                route, method, status
            )
        series.observe(seconds)

    def refused_auth(self) -> None:
        self.refusals.labels("auth").inc()

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
