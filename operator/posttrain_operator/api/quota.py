"""BudgetQuota: a namespace's dollar quota over a period, the flavors and backends its Episodes may use,
and the largest budget one Episode may ask for (docs/quotas.md).

A namespace has at most one, named `default` (the CRD holds it to that name), so the operator reads
it by name and the Episode admission policy finds it as its parameter. Its spec is the platform's;
its status is the operator's second ledger, beside each Episode's, kept by the same rule: reserve a
job's worst case before it runs, settle at what the backend billed.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, Field, PlainSerializer, WithJsonSchema

from posttrain_operator.api.models import (
    CONDITIONS_LIST_TYPE,
    MAX_CONDITIONS,
    ApiModel,
    Backend,
    Condition,
    micro_usd,
)
from posttrain_operator.api.money import USD_PATTERN

QUOTA_NAME = "default"
QuotaPeriod = Literal["CalendarMonth", "Rolling"]
# One entry per job admitted and not yet settled: the status must stay far below etcd's object size.
# Agent jobs are refused past MAX_QUOTA_RESERVATIONS; grader jobs, never refused, have the headroom.
MAX_QUOTA_RESERVATIONS = 4000
GRADER_HEADROOM = 1000
MAX_PERIOD_RECORDS = 13  # calendar months: this one and a year back; a rolling window keeps its days
PERIOD_KEY_PATTERN = r"^[0-9]{4}-[0-9]{2}(-[0-9]{2})?$"


class BudgetQuotaSpec(ApiModel):
    limit_usd: str = Field(
        alias="limitUSD",
        pattern=USD_PATTERN,
        description="limitUSD is what agent jobs of this namespace may spend per period, a decimal string.",
    )
    period: QuotaPeriod = Field(
        default="CalendarMonth",
        description="period is CalendarMonth (UTC months; a job counts in the month it was admitted) or "
        "Rolling (the last windowDays UTC days, today included).",
    )
    window_days: int | None = Field(
        default=None, ge=1, le=366, description="windowDays is the Rolling window's length, in days."
    )
    max_episode_budget_usd: str | None = Field(
        default=None,
        alias="maxEpisodeBudgetUSD",
        pattern=USD_PATTERN,
        description="maxEpisodeBudgetUSD is the largest budgetUSD one Episode may ask for.",
    )
    flavors: list[str] | None = Field(
        default=None,
        max_length=64,
        description="flavors the namespace's jobs may use; absent: any the backend offers.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )
    backends: list[Backend] | None = Field(
        default=None,
        max_length=2,
        description="backends the namespace's Episodes may use; absent: any.",
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


class QuotaReservation(ApiModel):
    episode: str = Field(max_length=253, description="episode is the job's Episode.")
    period: str = Field(
        pattern=PERIOD_KEY_PATTERN,
        description="period is the month (YYYY-MM) or day (YYYY-MM-DD) the job was admitted in; its "
        "spend is booked there.",
    )
    micro_usd: int = Field(
        alias="microUSD", ge=0, description="microUSD is the job's worst case, held (0 for grader jobs)."
    )
    platform: bool = Field(default=False, description="platform is true for grader jobs (never refused).")


class PeriodRecord(ApiModel):
    period: str = Field(pattern=PERIOD_KEY_PATTERN, description="period is a month (YYYY-MM) or a day.")
    reserved_micro_usd: int = micro_usd("reservedMicroUSD", "reservedMicroUSD is held by running jobs.")
    settled_micro_usd: int = micro_usd("settledMicroUSD", "settledMicroUSD is what ended agent jobs cost.")
    platform_micro_usd: int = micro_usd(
        "platformMicroUSD",
        "platformMicroUSD is grader spend (and billing overruns), recorded, never refused.",
    )
    jobs: int = Field(default=0, ge=0, description="jobs counts the jobs admitted in the period.")


def _held_from_wire(raw: Any) -> Any:
    """Reservations as written: one line per job, `JOB EPISODE PERIOD MICROUSD [platform]`."""
    if not isinstance(raw, list):
        return raw  # already by job (built in Python)
    held: dict[str, dict[str, Any]] = {}
    for line in raw:
        parts = str(line).split(" ")
        if len(parts) not in (4, 5) or parts[4:] not in ([], ["platform"]) or not parts[3].isdigit():
            raise ValueError(f"reservation {line!r} is not 'JOB EPISODE PERIOD MICROUSD [platform]'")
        job, episode, period, micro_usd = parts[:4]
        held[job] = {
            "episode": episode,
            "period": period,
            "microUSD": int(micro_usd),
            "platform": len(parts) == 5,
        }
    return held


def _held_to_wire(held: dict[str, QuotaReservation]) -> list[str]:
    return [
        f"{job} {r.episode} {r.period} {r.micro_usd}" + (" platform" if r.platform else "")
        for job, r in sorted(held.items())
    ]


# By job in Python; on the wire, one string per job in an atomic list. The API server validates and
# tracks the fields of a map of objects one by one: with 1,000 jobs running in a namespace, each
# admission's write of its quota took 190 ms as a map against 19 ms as these lines (docs/benchmarks.md).
Reservations = Annotated[
    dict[str, QuotaReservation],
    BeforeValidator(_held_from_wire),
    PlainSerializer(_held_to_wire, return_type=list[str]),
    WithJsonSchema({
        "type": "array",
        "maxItems": MAX_QUOTA_RESERVATIONS + GRADER_HEADROOM,
        "x-kubernetes-list-type": "atomic",
        "items": {"type": "string", "maxLength": 600},
        "description": "reservations holds one line per AgentJob admitted and not yet settled: "
        "'JOB EPISODE PERIOD MICROUSD', and ' platform' for a grader job.",
    }),
]  # fmt: skip


class BudgetQuotaStatus(ApiModel):
    window: str | None = Field(
        default=None,
        max_length=32,
        description="window is the period in force: a month, or the rolling window's first..last day.",
    )
    limit_micro_usd: int = micro_usd("limitMicroUSD", "limitMicroUSD is spec.limitUSD in micro-dollars.")
    reserved_micro_usd: int = micro_usd(
        "reservedMicroUSD", "reservedMicroUSD is the window's running jobs' worst case."
    )
    settled_micro_usd: int = micro_usd("settledMicroUSD", "settledMicroUSD is the window's settled spend.")
    platform_micro_usd: int = micro_usd("platformMicroUSD", "platformMicroUSD is the window's grader spend.")
    remaining_micro_usd: int = micro_usd(
        "remainingMicroUSD", "remainingMicroUSD is what new reservations may take in the window."
    )
    remaining_usd: str = Field(default="0.00", alias="remainingUSD", description="remainingUSD in dollars.")
    spent_usd: str = Field(
        default="0.00", alias="spentUSD", description="spentUSD is settledMicroUSD in dollars."
    )
    periods: list[PeriodRecord] = Field(
        default_factory=list,
        max_length=367,
        description="periods are the records per month (or per day, Rolling), oldest first: a period "
        "that has passed is left as it ended.",
        json_schema_extra={"x-kubernetes-list-type": "atomic"},  # written whole on every admission
    )
    reservations: Reservations = Field(
        default_factory=dict, max_length=MAX_QUOTA_RESERVATIONS + GRADER_HEADROOM
    )
    conditions: list[Condition] = Field(
        default_factory=list, max_length=MAX_CONDITIONS, json_schema_extra=CONDITIONS_LIST_TYPE,
        description="conditions: Ready (the spec is understood and applied), OverLimit (the window's spend "
        "is above a limit lowered since), FlavorsOffered (a backend it allows offers every flavor it lists).",
    )  # fmt: skip
    observed_generation: int | None = Field(
        default=None, description="observedGeneration is the spec generation the operator last applied."
    )
