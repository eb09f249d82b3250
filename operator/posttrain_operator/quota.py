"""The namespace's quota ledger: pure functions over a BudgetQuota's status, in integer micro-dollars.

The same rule as the Episode's ledger (`ledger.py`), over a period instead of a lifetime. A job's
reservation is booked in the period it was admitted in (a month, or a day of a rolling window) and
so is its spend when it settles: a job admitted on the 31st and billed on the 1st does not eat the
new month's headroom, and a period that has passed keeps the record it ended with. Each job has at
most one reservation, keyed by name, so reserving and settling are idempotent; totals are recomputed
from the entries. Invariant, for the window in force: reserved + settled <= limit (unless the
platform lowered the limit since: the OverLimit condition says so, and nothing is admitted).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from posttrain_operator.api.models import Backend
from posttrain_operator.api.money import micro_to_usd, usd_to_micro
from posttrain_operator.api.quota import (
    MAX_PERIOD_RECORDS,
    MAX_QUOTA_RESERVATIONS,
    BudgetQuotaSpec,
    BudgetQuotaStatus,
    PeriodRecord,
    QuotaReservation,
)


class InvalidQuota(ValueError):
    """A BudgetQuota spec the operator cannot apply; the message says what is wrong."""


@dataclass(frozen=True)
class QuotaTerms:
    """A BudgetQuota's spec, parsed: what the operator enforces."""

    limit_micro_usd: int
    rolling_days: int | None  # None: calendar months
    max_episode_budget_micro_usd: int | None
    flavors: frozenset[str] | None
    backends: frozenset[Backend] | None

    def period_of(self, now: datetime) -> str:
        """The key a job admitted at `now` is booked under: its UTC month, or its UTC day (rolling)."""
        return now.strftime("%Y-%m-%d" if self.rolling_days else "%Y-%m")

    def in_window(self, period: str, now: datetime) -> bool:
        if self.rolling_days is None:
            return period == self.period_of(now)
        first = (now - timedelta(days=self.rolling_days - 1)).strftime("%Y-%m-%d")
        return len(period) == 10 and first <= period <= self.period_of(now)

    def window(self, now: datetime) -> str:
        if self.rolling_days is None:
            return self.period_of(now)
        first = now - timedelta(days=self.rolling_days - 1)
        return f"{first:%Y-%m-%d}..{now:%Y-%m-%d}"

    def allows_flavor(self, flavor: str) -> bool:
        return self.flavors is None or flavor in self.flavors


def terms_of(spec: BudgetQuotaSpec) -> QuotaTerms:
    """Parse a spec the schema let through; InvalidQuota for what only the operator can judge (a
    CRD installed from another version of the project may let more through than this one knows)."""
    if spec.period == "Rolling" and spec.window_days is None:
        raise InvalidQuota("period Rolling needs windowDays")
    if spec.period == "CalendarMonth" and spec.window_days is not None:
        raise InvalidQuota("windowDays is for period Rolling only")
    cap = spec.max_episode_budget_usd
    return QuotaTerms(
        limit_micro_usd=usd_to_micro(spec.limit_usd),
        rolling_days=spec.window_days if spec.period == "Rolling" else None,
        max_episode_budget_micro_usd=usd_to_micro(cap) if cap is not None else None,
        flavors=frozenset(spec.flavors) if spec.flavors is not None else None,
        backends=frozenset(spec.backends) if spec.backends is not None else None,
    )


def with_totals(status: BudgetQuotaStatus, terms: QuotaTerms, now: datetime) -> BudgetQuotaStatus:
    """Per-period reserved figures from the reservations, the window's totals, and the records pruned
    to the newest (a period still holding a reservation is kept)."""
    held: dict[str, int] = {}
    for entry in status.reservations.values():
        held[entry.period] = held.get(entry.period, 0) + entry.micro_usd
    records = {r.period: r for r in status.periods}
    for period in held.keys() - records.keys():
        records[period] = PeriodRecord(period=period)
    ordered = [records[p].model_copy(update={"reserved_micro_usd": held.get(p, 0)}) for p in sorted(records)]
    keep = MAX_PERIOD_RECORDS if terms.rolling_days is None else terms.rolling_days + 1
    unheld = [r.period for r in ordered if r.period not in held]
    dropped = set(unheld[: max(0, len(ordered) - keep)])
    ordered = [r for r in ordered if r.period not in dropped]
    window = [r for r in ordered if terms.in_window(r.period, now)]
    reserved = sum(r.reserved_micro_usd for r in window)
    settled = sum(r.settled_micro_usd for r in window)
    remaining = max(0, terms.limit_micro_usd - reserved - settled)
    return status.model_copy(
        update={
            "window": terms.window(now),
            "limit_micro_usd": terms.limit_micro_usd,
            "reserved_micro_usd": reserved,
            "settled_micro_usd": settled,
            "platform_micro_usd": sum(r.platform_micro_usd for r in window),
            "remaining_micro_usd": remaining,
            "remaining_usd": micro_to_usd(remaining),
            "spent_usd": micro_to_usd(settled),
            "periods": ordered,
        }
    )


def over_limit(status: BudgetQuotaStatus) -> bool:
    return status.reserved_micro_usd + status.settled_micro_usd > status.limit_micro_usd


@dataclass(frozen=True)
class QuotaDecision:
    status: BudgetQuotaStatus | None  # None: nothing to write
    refusal: str = ""  # why the job does not fit, for the agent; empty when it does


def reserve(
    status: BudgetQuotaStatus,
    terms: QuotaTerms,
    job: str,
    episode: str,
    amount: int,
    now: datetime,
    *,
    platform: bool = False,
) -> QuotaDecision:
    """Reserve `amount` for `job` if the window allows it; a grader job (platform) is recorded at 0
    and never refused, so its spend can be booked once when it settles."""
    if job in status.reservations:
        return QuotaDecision(None)
    status = with_totals(status, terms, now)
    if not platform:
        if len(status.reservations) >= MAX_QUOTA_RESERVATIONS:
            return QuotaDecision(
                None, f"the namespace has {MAX_QUOTA_RESERVATIONS} jobs running, the most its quota tracks"
            )
        if status.reserved_micro_usd + status.settled_micro_usd + amount > terms.limit_micro_usd:
            return QuotaDecision(None, _refusal(status, amount))
    period = terms.period_of(now)
    entry = QuotaReservation(
        episode=episode, period=period, micro_usd=0 if platform else amount, platform=platform
    )
    records = [r.model_copy(update={"jobs": r.jobs + 1}) if r.period == period else r for r in status.periods]
    if not any(r.period == period for r in records):
        records.append(PeriodRecord(period=period, jobs=1))
    status = status.model_copy(
        update={"reservations": {**status.reservations, job: entry}, "periods": records}
    )
    return QuotaDecision(with_totals(status, terms, now))


def _refusal(status: BudgetQuotaStatus, amount: int) -> str:
    return (
        f"the namespace's BudgetQuota has ${micro_to_usd(status.remaining_micro_usd)} left of its "
        f"${micro_to_usd(status.limit_micro_usd)} for {status.window} "
        f"(${micro_to_usd(status.settled_micro_usd)} spent, ${micro_to_usd(status.reserved_micro_usd)} "
        f"reserved by running jobs); this job needs ${micro_to_usd(amount)}"
    )


def release(
    status: BudgetQuotaStatus, terms: QuotaTerms, job: str, now: datetime
) -> BudgetQuotaStatus | None:
    """Drop `job`'s reservation without a charge: its Episode refused it, or it never ran. None when
    it holds none."""
    entry = status.reservations.get(job)
    if entry is None:
        return None
    rest = {name: e for name, e in status.reservations.items() if name != job}
    records = [
        r.model_copy(update={"jobs": max(0, r.jobs - 1)}) if r.period == entry.period else r
        for r in status.periods
    ]
    return with_totals(status.model_copy(update={"reservations": rest, "periods": records}), terms, now)


def settle(
    status: BudgetQuotaStatus, terms: QuotaTerms, job: str, cost: int, now: datetime
) -> BudgetQuotaStatus | None:
    """Book `job`'s billed `cost` in its period and drop its reservation; None when it holds none
    (settled already, or admitted before the quota existed). As on the Episode's ledger, an agent job
    is charged at most its reservation and the rest is platform spend (the backend enforced the
    timeout; a higher bill is the rounding of start and finish stamps)."""
    entry = status.reservations.get(job)
    if entry is None:
        return None
    charged = 0 if entry.platform else min(cost, entry.micro_usd)
    platform = cost - charged
    records = [
        r.model_copy(
            update={
                "settled_micro_usd": r.settled_micro_usd + charged,
                "platform_micro_usd": r.platform_micro_usd + platform,
            }
        )
        if r.period == entry.period
        else r
        for r in status.periods
    ]
    if not any(r.period == entry.period for r in records):
        records.append(
            PeriodRecord(period=entry.period, settled_micro_usd=charged, platform_micro_usd=platform)
        )
    rest = {name: e for name, e in status.reservations.items() if name != job}
    return with_totals(status.model_copy(update={"reservations": rest, "periods": records}), terms, now)
