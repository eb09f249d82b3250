"""The gateway's /metrics, scraped after real tool calls through the choke point (the operator and the
API server behind it): each call counts under its tool and result, and each refusal under its reason."""

from __future__ import annotations

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.gateway.support import GatewayServer, orchestrator

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]
REASON_OF = {"step_limit_reached": "step_limit", "episode_done": "episode_done"}


def scrape(gw: GatewayServer) -> tuple[str, Samples]:
    response = httpx.get(f"{gw.url}/metrics", timeout=10)
    assert response.status_code == 200
    samples = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }
    return response.text, samples


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def error_code(reply: dict[str, object]) -> str | None:
    observation = reply["observation"]
    assert isinstance(observation, dict)
    code = observation["metadata"].get("error_code")
    return None if code is None else str(code)


async def test_tool_calls_and_refusals_count_by_tool_result_and_reason(gateway: GatewayServer) -> None:
    async with orchestrator(gateway) as orch:
        reset = await orch.reset(task="t0_artifact", budget_usd="0.001", max_steps=3)
        episode = reset["observation"]["episode"]
        assert error_code(await orch.call("task_info")) is None
        # 600 s on cpu-basic reserves $0.00167 of a $0.001 budget: refused by the operator's ledger.
        assert error_code(await orch.call("jobs_submit", script="print(1)", timeout_seconds=600)) == (
            "budget_exceeded"
        )
        assert error_code(await orch.call("jobs_submit", script="")) == "invalid_arguments"
        assert error_code(await orch.call("task_info")) is None  # the third and last step
        over = error_code(await orch.call("task_info"))
        assert over in REASON_OF  # the step limit, or the episode the operator ended for it
    async with httpx.AsyncClient(timeout=30) as http:
        refused = await http.post(
            f"{gateway.url}/mcp",
            json={"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}},
            headers={"Authorization": "Bearer not-a-token"},
            timeout=30,
        )
    assert refused.status_code == 401

    text, got = scrape(gateway)
    calls = "posttrain_gateway_tool_calls_total"
    assert value(got, calls, tool="task_info", result="ok") == 2
    assert value(got, calls, tool="jobs_submit", result="budget_exceeded") == 1
    assert value(got, calls, tool="jobs_submit", result="invalid_arguments") == 1
    assert value(got, calls, tool="task_info", result=over) == 1
    refusals = "posttrain_gateway_refusals_total"
    want = {"budget": 1, "validation": 1, "auth": 1, REASON_OF[over]: 1, "time_limit": 0}
    assert {reason: value(got, refusals, reason=reason) for reason in want} == want
    assert value(got, "posttrain_gateway_tool_call_duration_seconds_count", tool="task_info") == 3
    assert (
        value(
            got, "posttrain_gateway_request_duration_seconds_count", route="/mcp", method="POST", status="401"
        )
        == 1
    )
    assert episode not in text
