"""The budget ledger: pure functions over integer micro-dollars.

Each AgentJob has at most one entry, keyed by name, so reserving and settling are idempotent: a
reconcile retried after a crash finds its own entry and changes nothing. Totals are recomputed from
the entries, so they can never drift from them. Invariant: reserved + settled <= budget.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from posttrain_operator.api.episode import Ledger, LedgerEntry
from posttrain_operator.api.money import micro_to_usd


def reservation_for(price_micro_per_minute: int, timeout_seconds: int) -> int:
    """The worst case a job can bill: every started minute of its timeout."""
    return price_micro_per_minute * math.ceil(timeout_seconds / 60)


def billed_seconds(started: datetime | None, finished: datetime | None) -> int:
    """Wall seconds the backend billed for; a job that never started bills nothing."""
    if started is None or finished is None or finished <= started:
        return 0
    return math.ceil((finished - started).total_seconds())


def cost_for(price_micro_per_minute: int, seconds: int) -> int:
    """Per started minute, as HF bills."""
    return price_micro_per_minute * math.ceil(seconds / 60)


def with_totals(ledger: Ledger) -> Ledger:
    agent = [e for e in ledger.entries.values() if not e.platform]
    reserved = sum(e.reserved_micro_usd for e in agent if e.settled_micro_usd is None)
    settled = sum(e.settled_micro_usd or 0 for e in agent)
    platform = sum(e.settled_micro_usd or 0 for e in ledger.entries.values() if e.platform)
    return ledger.model_copy(
        update={
            "reserved_micro_usd": reserved,
            "settled_micro_usd": settled,
            "platform_micro_usd": platform,
            "reserved_usd": micro_to_usd(reserved),
            "spent_usd": micro_to_usd(settled),
        }
    )


def unsettled(ledger: Ledger) -> set[str]:
    """The entries still holding a reservation."""
    return {name for name, entry in ledger.entries.items() if entry.settled_micro_usd is None}


def invariant_holds(ledger: Ledger) -> bool:
    return ledger.reserved_micro_usd + ledger.settled_micro_usd <= ledger.budget_micro_usd


@dataclass(frozen=True)
class Reservation:
    ledger: Ledger
    changed: bool
    admitted: bool
    message: str = ""


def reserve(ledger: Ledger, job: str, amount: int, *, platform: bool = False) -> Reservation:
    """Reserve `amount` for `job` if the budget allows; platform (grader) jobs are never refused."""
    if job in ledger.entries:
        return Reservation(ledger, changed=False, admitted=True)
    if not platform:
        committed = ledger.reserved_micro_usd + ledger.settled_micro_usd
        if committed + amount > ledger.budget_micro_usd:
            remaining = ledger.budget_micro_usd - committed
            return Reservation(
                ledger,
                changed=False,
                admitted=False,
                message=(
                    f"job needs ${micro_to_usd(amount)} reserved (price per minute x timeout minutes) "
                    f"but only ${micro_to_usd(remaining)} of the ${micro_to_usd(ledger.budget_micro_usd)} "
                    "budget is left "
                    f"(${micro_to_usd(ledger.settled_micro_usd)} spent, "
                    f"${micro_to_usd(ledger.reserved_micro_usd)} reserved by running jobs)"
                ),
            )
    entries = {
        **ledger.entries,
        job: LedgerEntry(reserved_micro_usd=0 if platform else amount, platform=platform),
    }
    return Reservation(
        with_totals(ledger.model_copy(update={"entries": entries})), changed=True, admitted=True
    )


@dataclass(frozen=True)
class Settlement:
    """What settling did to a ledger, the one shape every settling path returns: the ledger after; the
    jobs whose entries it settled now (none: nothing changed); what the job was charged (one job:
    its settled amount, also when it was settled before; several: their sum); and what it added to
    the ledger's agent total (`settled_micro_usd`) and to its platform total."""

    ledger: Ledger
    jobs: tuple[str, ...] = ()
    charged: int = 0
    agent: int = 0
    platform: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.jobs)


def _settlement(before: Ledger, after: Ledger, jobs: tuple[str, ...], charged: int) -> Settlement:
    return Settlement(
        after,
        jobs,
        charged,
        after.settled_micro_usd - before.settled_micro_usd,
        after.platform_micro_usd - before.platform_micro_usd,
    )


def settle(ledger: Ledger, job: str, cost: int) -> Settlement:
    """Release `job`'s reservation and charge its real cost.

    An agent job is charged at most what it reserved: the backend enforces the timeout, so a higher
    bill is a rounding artefact of start/finish stamps and is booked as platform spend instead of
    breaking the invariant. A job with no entry (never admitted) is booked as platform spend.
    """
    entry = ledger.entries.get(job)
    if entry is not None and entry.settled_micro_usd is not None:
        return Settlement(ledger, charged=entry.settled_micro_usd)
    if entry is None or entry.platform:
        settled = LedgerEntry(reserved_micro_usd=0, settled_micro_usd=cost, platform=True)
        after = with_totals(ledger.model_copy(update={"entries": {**ledger.entries, job: settled}}))
        return _settlement(ledger, after, (job,), cost)
    charged = min(cost, entry.reserved_micro_usd)
    entries = {**ledger.entries, job: entry.model_copy(update={"settled_micro_usd": charged})}
    overrun = cost - charged
    if overrun:
        entries[f"{job}.overrun"] = LedgerEntry(settled_micro_usd=overrun, platform=True)
    return _settlement(ledger, with_totals(ledger.model_copy(update={"entries": entries})), (job,), charged)


def settle_at_reservation(ledger: Ledger, jobs: Iterable[str]) -> Settlement:
    """Settle each of `jobs` that still holds a reservation at the whole of it, its worst case: for a
    job whose real run time can no longer be known. Unknown or already settled jobs are left as they are."""
    after, settled, charged = ledger, [], 0
    for job in jobs:
        entry = after.entries.get(job)
        if entry is not None and entry.settled_micro_usd is None:
            one = settle(after, job, entry.reserved_micro_usd)
            after, charged = one.ledger, charged + one.charged
            settled.append(job)
    return _settlement(ledger, after, tuple(settled), charged)
