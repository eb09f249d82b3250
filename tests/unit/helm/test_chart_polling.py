"""The operator's polling settings, from the chart's values to the settings the operator parses."""

from __future__ import annotations

import pytest
from posttrain_operator.config import OperatorSettings

from tests.unit.helm.chart import FULL, container_env, main_container, render, render_error


def test_the_poll_request_budget_reaches_the_operator_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    values = {"operator": {"pollIntervalSeconds": 5, "pollRequestsPerMinute": 300}}
    env = container_env(main_container(render(values), f"{FULL}-operator"))
    for name in ("POSTTRAIN_POLL_INTERVAL_SECONDS", "POSTTRAIN_POLL_REQUESTS_PER_MINUTE"):
        monkeypatch.setenv(name, env[name]["value"])
    settings = OperatorSettings()
    assert (settings.poll_interval_seconds, settings.poll_requests_per_minute) == (5, 300)


def test_a_poll_request_budget_of_zero_is_refused_before_install() -> None:
    assert "pollRequestsPerMinute" in render_error({"operator": {"pollRequestsPerMinute": 0}})
