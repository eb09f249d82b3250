"""The namespace quota's pure ledger: periods, rollover, reserve/release/settle, and the invariant under
random sequences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from posttrain_operator import quota
from posttrain_operator.api.quota import BudgetQuotaSpec, BudgetQuotaStatus
from pydantic import ValidationError

DEC_31 = datetime(2026, 12, 31, 23, 59, 59, tzinfo=UTC)
JAN_1 = datetime(2027, 1, 1, 0, 0, 0, tzinfo=UTC)


def terms(**spec: object) -> quota.QuotaTerms:
    return quota.terms_of(BudgetQuotaSpec.model_validate({"limitUSD": "0.001000", **spec}))


def test_calendar_month_books_a_job_in_the_month_it_was_admitted() -> None:
    month = terms()
    assert month.period_of(DEC_31) == "2026-12" and month.period_of(JAN_1) == "2027-01"
    assert month.in_window("2026-12", DEC_31) and not month.in_window("2026-12", JAN_1)
    assert month.window(JAN_1) == "2027-01"


def test_a_rolling_window_counts_its_last_days_today_included() -> None:
    week = terms(period="Rolling", windowDays=7)
    assert week.period_of(JAN_1) == "2027-01-01"
    assert week.in_window("2026-12-26", JAN_1) and not week.in_window("2026-12-25", JAN_1)
    assert not week.in_window("2026-12", JAN_1)  # a month's record is not a day of the window
    assert week.window(JAN_1) == "2026-12-26..2027-01-01"


def test_the_limit_is_refused_past_it_and_the_refusal_gives_the_numbers() -> None:
    t, status = terms(), BudgetQuotaStatus()
    for i in range(3):
        decided = quota.reserve(status, t, f"j{i}", "ep", 300, DEC_31)
        assert decided.status is not None and not decided.refusal
        status = decided.status
    refused = quota.reserve(status, t, "j3", "ep", 300, DEC_31)
    assert refused.status is None
    assert "$0.0001 left of its $0.001 for 2026-12" in refused.refusal
    assert "$0.0009 reserved by running jobs); this job needs $0.0003" in refused.refusal
    assert status.reserved_micro_usd == 900 and status.remaining_micro_usd == 100
    again = quota.reserve(status, t, "j0", "ep", 300, DEC_31)
    assert again.status is None and not again.refusal  # idempotent: its reservation stands


def test_settling_books_at_most_the_reservation_and_the_rest_as_platform_spend() -> None:
    t = terms()
    status = quota.reserve(BudgetQuotaStatus(), t, "j", "ep", 300, DEC_31).status
    assert status is not None
    settled = quota.settle(status, t, "j", 500, DEC_31)
    assert settled is not None
    assert (settled.settled_micro_usd, settled.platform_micro_usd, settled.reserved_micro_usd) == (
        300,
        200,
        0,
    )
    assert quota.settle(settled, t, "j", 500, DEC_31) is None  # once only


def test_a_grader_job_is_never_refused_and_its_spend_is_the_platforms() -> None:
    t = terms(limitUSD="0")
    decided = quota.reserve(BudgetQuotaStatus(), t, "score", "ep", 10_000, DEC_31, platform=True)
    assert decided.status is not None and decided.status.reservations["score"].micro_usd == 0
    settled = quota.settle(decided.status, t, "score", 700, DEC_31)
    assert settled is not None and (settled.settled_micro_usd, settled.platform_micro_usd) == (0, 700)


def test_a_release_frees_the_reservation_without_a_charge() -> None:
    t = terms()
    status = quota.reserve(BudgetQuotaStatus(), t, "j", "ep", 1000, DEC_31).status
    assert status is not None and status.remaining_micro_usd == 0
    released = quota.release(status, t, "j", DEC_31)
    assert released is not None and released.remaining_micro_usd == 1000 and released.settled_micro_usd == 0
    assert released.periods[0].jobs == 0
    assert quota.release(released, t, "j", DEC_31) is None


def test_rollover_frees_the_new_month_and_leaves_the_old_months_record_as_it_ended() -> None:
    t = terms()
    status = quota.reserve(BudgetQuotaStatus(), t, "late", "ep", 1000, DEC_31).status
    assert status is not None
    refused = quota.reserve(status, t, "dec", "ep", 1, DEC_31)
    assert refused.refusal
    # On the 1st the new month has its whole limit, though December's job still runs...
    january = quota.reserve(status, t, "jan", "ep", 1000, JAN_1).status
    assert january is not None and january.window == "2027-01" and january.remaining_micro_usd == 0
    # ...and that job, billed in January, is booked in December, which keeps its own record.
    settled = quota.settle(january, t, "late", 600, JAN_1)
    assert settled is not None
    records = {r.period: r for r in settled.periods}
    assert (records["2026-12"].settled_micro_usd, records["2026-12"].jobs) == (600, 1)
    assert (records["2027-01"].reserved_micro_usd, records["2027-01"].settled_micro_usd) == (1000, 0)
    assert (settled.settled_micro_usd, settled.reserved_micro_usd) == (0, 1000)


def test_records_keep_a_year_of_months_and_any_period_still_holding_a_reservation() -> None:
    t = terms(limitUSD="1")
    status = quota.reserve(BudgetQuotaStatus(), t, "long", "ep", 1, datetime(2025, 1, 15, tzinfo=UTC)).status
    for month in range(2, 13):
        assert status is not None
        day = datetime(2025, month, 15, tzinfo=UTC)
        status = quota.settle(
            quota.reserve(status, t, f"m{month}", "ep", 1, day).status or status, t, f"m{month}", 1, day
        )
    for month in range(1, 5):
        assert status is not None
        day = datetime(2026, month, 15, tzinfo=UTC)
        status = quota.reserve(status, t, f"n{month}", "ep", 1, day).status
    assert status is not None
    periods = [r.period for r in status.periods]
    assert periods[0] == "2025-01"  # still holds "long"
    assert len(periods) == 13 and periods[1:3] == ["2025-05", "2025-06"] and periods[-1] == "2026-04"
    settled = quota.settle(status, t, "long", 1, datetime(2026, 4, 15, tzinfo=UTC))
    assert settled is not None
    assert (settled.periods[0].period, settled.periods[0].settled_micro_usd) == ("2025-01", 1)
    may = quota.reserve(settled, t, "n5", "ep", 1, datetime(2026, 5, 15, tzinfo=UTC)).status
    assert may is not None and [r.period for r in may.periods][:2] == ["2025-05", "2025-06"]


def test_a_limit_lowered_below_the_spend_reports_over_limit_and_admits_nothing() -> None:
    status = quota.reserve(BudgetQuotaStatus(), terms(), "j", "ep", 800, DEC_31).status
    assert status is not None
    lowered = terms(limitUSD="0.0005")
    refreshed = quota.with_totals(status, lowered, DEC_31)
    assert quota.over_limit(refreshed) and refreshed.remaining_micro_usd == 0
    assert refreshed.reservations == status.reservations  # nothing admitted is changed
    assert quota.reserve(refreshed, lowered, "k", "ep", 1, DEC_31).refusal


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ({"limitUSD": "-1"}, ValidationError),
        ({"limitUSD": "1e3"}, ValidationError),
        ({"limitUSD": "1", "period": "Fortnight"}, ValidationError),
        ({"limitUSD": "1", "period": "Rolling", "windowDays": 0}, ValidationError),
        ({"limitUSD": "1", "period": "Rolling"}, quota.InvalidQuota),
        ({"limitUSD": "1", "windowDays": 7}, quota.InvalidQuota),
    ],
)
def test_bad_specs_are_refused_with_a_clear_error(spec: dict[str, object], error: type[Exception]) -> None:
    with pytest.raises(error):
        quota.terms_of(BudgetQuotaSpec.model_validate(spec))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["reserve", "settle", "release"]),
            st.integers(0, 9),
            st.integers(0, 600),
            st.integers(0, 90),
        ),
        max_size=60,
    ),
    st.sampled_from([None, 7]),
)
def test_invariant_holds_under_any_sequence(
    ops: list[tuple[str, int, int, int]], rolling: int | None
) -> None:
    t = (
        terms(limitUSD="0.002")
        if rolling is None
        else terms(limitUSD="0.002", period="Rolling", windowDays=rolling)
    )
    status, now = BudgetQuotaStatus(), datetime(2026, 11, 1, tzinfo=UTC)
    billed = 0
    for op, job, amount, hours in ops:
        now += timedelta(hours=hours)
        name = f"j{job}"
        if op == "reserve":
            status = quota.reserve(status, t, name, "ep", amount, now).status or status
        elif op == "settle":
            held = status.reservations.get(name)
            settled = quota.settle(status, t, name, amount, now)
            if settled is not None:
                assert held is not None
                billed += amount
                status = settled
        else:
            status = quota.release(status, t, name, now) or status
        refreshed = quota.with_totals(status, t, now)
        assert refreshed.reserved_micro_usd + refreshed.settled_micro_usd <= t.limit_micro_usd
    booked = sum(r.settled_micro_usd + r.platform_micro_usd for r in status.periods)
    assert booked <= billed  # equal unless pruning dropped old records


def test_reservations_are_written_one_line_per_job_and_read_back_the_same() -> None:
    status = BudgetQuotaStatus.model_validate(
        {"reservations": {"j1": {"episode": "ep", "period": "2026-12", "microUSD": 100},
                          "score": {"episode": "ep", "period": "2026-12", "microUSD": 0, "platform": True}}}
    )  # fmt: skip
    wire = status.wire()
    assert wire["reservations"] == ["j1 ep 2026-12 100", "score ep 2026-12 0 platform"]
    assert BudgetQuotaStatus.model_validate(wire) == status


@pytest.mark.parametrize(
    "line", ["j1 ep 2026-12", "j1 ep 2026-12 -5", "j1 ep 2026-12 5 grader", "j1 ep 2026-13x 5"]
)
def test_a_reservation_line_that_is_not_one_is_refused(line: str) -> None:
    with pytest.raises(ValidationError, match=r"reservation|period"):
        BudgetQuotaStatus.model_validate({"reservations": [line]})
