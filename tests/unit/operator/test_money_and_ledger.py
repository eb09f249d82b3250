"""Money parsing and the ledger's pure functions, including the invariant under random sequences."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from posttrain_operator import ledger
from posttrain_operator.api.episode import Ledger
from posttrain_operator.api.money import micro_to_usd, usd_to_micro


@pytest.mark.parametrize(
    ("text", "micro"), [("0", 0), ("2.50", 2_500_000), ("0.000167", 167), ("1000000", 1_000_000_000_000)]
)
def test_usd_to_micro_is_exact(text: str, micro: int) -> None:
    assert usd_to_micro(text) == micro


@pytest.mark.parametrize("text", ["-1", "abc", "1.0000001", "NaN", "inf", ""])
def test_usd_to_micro_refuses_bad_amounts(text: str) -> None:
    with pytest.raises(ValueError, match=r"dollar amount|decimal"):
        usd_to_micro(text)


@pytest.mark.parametrize(
    ("micro", "text"), [(0, "0.00"), (1_500_000, "1.50"), (167, "0.000167"), (10, "0.00001")]
)
def test_micro_to_usd_keeps_every_micro(micro: int, text: str) -> None:
    assert micro_to_usd(micro) == text


def test_reservation_is_price_times_started_minutes() -> None:
    assert ledger.reservation_for(167, 60) == 167
    assert ledger.reservation_for(167, 61) == 334
    assert ledger.reservation_for(167, 3600) == 167 * 60


def test_billing_is_per_started_minute_and_zero_if_never_started() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    assert ledger.billed_seconds(start, start + timedelta(seconds=59.2)) == 60
    assert ledger.cost_for(167, 60) == 167
    assert ledger.cost_for(167, 61) == 334
    assert ledger.billed_seconds(None, start) == 0
    assert ledger.cost_for(167, 0) == 0


def _fresh(budget: int) -> Ledger:
    return ledger.with_totals(Ledger(budget_micro_usd=budget))


def test_reserve_refuses_past_the_budget_with_the_numbers() -> None:
    book = ledger.reserve(_fresh(1000), "a", 600).ledger
    refused = ledger.reserve(book, "b", 600)
    assert not refused.admitted and not refused.changed
    assert "$0.0006" in refused.message and "$0.0004" in refused.message
    assert refused.ledger == book


def test_reserve_and_settle_are_idempotent_per_job() -> None:
    book = ledger.reserve(_fresh(1000), "a", 600).ledger
    again = ledger.reserve(book, "a", 600)
    assert again.admitted and not again.changed and again.ledger == book
    first = ledger.settle(book, "a", 200)
    assert (first.jobs, first.charged, first.agent, first.platform) == (("a",), 200, 200, 0)
    settled = first.ledger
    assert (settled.reserved_micro_usd, settled.settled_micro_usd) == (0, 200)
    assert ledger.settle(settled, "a", 999) == ledger.Settlement(settled, charged=200)
    assert not ledger.settle(settled, "a", 999).changed


def test_an_overrun_is_booked_as_platform_spend_not_charged_to_the_agent() -> None:
    book = ledger.reserve(_fresh(1000), "a", 600).ledger
    overrun = ledger.settle(book, "a", 800)
    settled = overrun.ledger
    assert (overrun.charged, overrun.agent, overrun.platform) == (600, 600, 200)
    assert settled.settled_micro_usd == 600 and settled.platform_micro_usd == 200
    assert ledger.invariant_holds(settled)


def test_platform_jobs_are_never_refused_and_never_charged() -> None:
    book = ledger.reserve(_fresh(0), "score", 10_000, platform=True).ledger
    booked = ledger.settle(book, "score", 500)
    settled = booked.ledger
    assert (booked.charged, booked.agent, booked.platform) == (500, 0, 500)
    assert (settled.reserved_micro_usd, settled.settled_micro_usd, settled.platform_micro_usd) == (0, 0, 500)


def test_settling_at_the_reservation_charges_the_worst_case_once_and_touches_nothing_else() -> None:
    book = ledger.reserve(_fresh(10_000), "gone", 600).ledger
    book = ledger.reserve(book, "done", 600).ledger
    book = ledger.reserve(book, "score", 0, platform=True).ledger
    book = ledger.settle(book, "done", 200).ledger
    settlement = ledger.settle_at_reservation(book, ["gone", "done", "score", "never-admitted"])
    assert (settlement.jobs, settlement.charged, settlement.agent, settlement.platform) == (
        ("gone", "score"),
        600,
        600,
        0,
    )
    settled = settlement.ledger
    assert settled.entries["gone"].settled_micro_usd == 600
    assert settled.entries["done"] == book.entries["done"]  # already settled: kept
    assert settled.entries["score"].settled_micro_usd == 0 and settled.entries["score"].platform
    assert "never-admitted" not in settled.entries
    assert (settled.reserved_micro_usd, settled.settled_micro_usd, settled.platform_micro_usd) == (0, 800, 0)
    assert ledger.invariant_holds(settled)
    assert ledger.settle_at_reservation(settled, ["gone"]) == ledger.Settlement(settled)


operations = st.lists(
    st.tuples(st.sampled_from(["reserve", "settle"]), st.integers(0, 9), st.integers(0, 5000)), max_size=60
)


@settings(max_examples=300, deadline=None)
@given(budget=st.integers(0, 20_000), ops=operations)
def test_invariant_holds_after_any_sequence(budget: int, ops: list[tuple[str, int, int]]) -> None:
    book = _fresh(budget)
    for op, job, amount in ops:
        if op == "reserve":
            book = ledger.reserve(book, f"j{job}", amount).ledger
        else:
            book = ledger.settle(book, f"j{job}", amount).ledger
        assert ledger.invariant_holds(book)
        assert book.reserved_micro_usd == sum(
            e.reserved_micro_usd
            for e in book.entries.values()
            if e.settled_micro_usd is None and not e.platform
        )
