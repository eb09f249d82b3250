"""The chart's BudgetQuotas (values budgetQuotas): one `default` per listed namespace with the spec as
given, which the operator's own model accepts; values the operator would refuse are refused at render."""

from __future__ import annotations

from typing import Any

import pytest
from posttrain_operator.api.quota import BudgetQuotaSpec

from tests.unit.helm.chart import find, render, render_error

TEAM_A = {"limitUSD": "2000", "flavors": ["cpu-basic", "t4-small"], "backends": ["hf-jobs"]}
TEAM_B = {"limitUSD": "150.5", "period": "Rolling", "windowDays": 30, "maxEpisodeBudgetUSD": "25"}


def test_each_listed_namespace_gets_its_quota_and_none_are_rendered_by_default() -> None:
    assert find(render(), "BudgetQuota") == []
    quotas = find(render({"budgetQuotas": {"team-a": TEAM_A, "team-b": TEAM_B}}), "BudgetQuota")
    by_namespace = {q["metadata"]["namespace"]: q for q in quotas}
    assert set(by_namespace) == {"team-a", "team-b"}
    for namespace, spec in (("team-a", TEAM_A), ("team-b", TEAM_B)):
        quota = by_namespace[namespace]
        assert quota["metadata"]["name"] == "default" and quota["spec"] == spec
        BudgetQuotaSpec.model_validate(quota["spec"])  # what the operator will parse


@pytest.mark.parametrize(
    ("spec", "field"),
    [
        ({"limitUSD": "-5"}, "limitUSD"),
        ({"limitUSD": "1e3"}, "limitUSD"),
        ({"limitUSD": "10", "period": "Fortnight"}, "period"),
        ({"limitUSD": "10", "backends": ["slurm"]}, "backends"),
        ({"limitUSD": "10", "windowDays": 400}, "windowDays"),
        ({"flavors": ["cpu-basic"]}, "limitUSD"),
        ({"limitUSD": "10", "limitUsd": "20"}, "limitUsd"),
    ],
)
def test_a_quota_the_operator_would_refuse_is_refused_at_render(spec: dict[str, Any], field: str) -> None:
    assert field in render_error({"budgetQuotas": {"team-a": spec}})


def test_a_namespace_name_that_cannot_exist_is_refused() -> None:
    assert "invalid propertyName 'Team_A'" in render_error({"budgetQuotas": {"Team_A": {"limitUSD": "1"}}})
