"""Pure views of Episodes and AgentJobs for people: table rows, the ledger per job, durations, and an
Episode's provenance."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

from posttrain_operator.api import provenance
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.provenance import ProvenanceSpec
from posttrain_operator.api.rules import parse_time

Obj = dict[str, Any]
EPISODE_COLUMNS = (
    "NAME",
    "PHASE",
    "OUTCOME",
    "TASK",
    "STEPS",
    "SPENT",
    "RESERVED",
    "BUDGET",
    "REWARD",
    "AGE",
)


def age(created: str | None, now: datetime) -> str:
    start = parse_time(created)
    if start is None:
        return "-"
    seconds = max(0, int((now - start).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def _interval(interval: Obj | None) -> str:
    return f" (95% interval {interval['low']}-{interval['high']})" if interval else ""


def episode_row(ep: Obj, now: datetime) -> tuple[str, ...]:
    status, spec = ep.get("status") or {}, ep.get("spec") or {}
    ledger = status.get("ledger") or {}
    return (
        ep["metadata"]["name"],
        status.get("phase") or "Pending",
        status.get("outcome") or "-",
        spec.get("task", "-"),
        str(status.get("steps") or 0),
        "$" + micro_to_usd(int(ledger.get("settledMicroUSD") or 0)),
        "$" + micro_to_usd(int(ledger.get("reservedMicroUSD") or 0)),
        "$" + str(spec.get("budgetUSD", "-")),
        str(status["reward"]) if status.get("reward") is not None else "-",
        age(ep["metadata"].get("creationTimestamp"), now),
    )


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(str(c)) for c in column) for column in zip(header, *rows, strict=True)]
    lines = [
        "   ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=True)).rstrip()
        for row in (header, *rows)
    ]
    return "\n".join(lines)


def ledger_rows(ep: Obj, jobs: list[Obj]) -> list[tuple[str, ...]]:
    """One row per ledger entry (a job, or a job's overrun booked as platform spend), with the job's
    purpose and phase beside it; jobs with no entry (refused before reserving) too."""
    entries: dict[str, Obj] = ((ep.get("status") or {}).get("ledger") or {}).get("entries") or {}
    by_name = {j["metadata"]["name"]: j for j in jobs}
    rows: list[tuple[str, ...]] = []
    for name in sorted(set(entries) | set(by_name), key=lambda n: _created(by_name.get(n.split(".")[0]), n)):
        entry, job = entries.get(name) or {}, by_name.get(name) or {}
        status = job.get("status") or {}
        settled = entry.get("settledMicroUSD")
        rows.append(
            (
                name,
                (job.get("spec") or {}).get("purpose", "-"),
                status.get("phase") or ("-" if not job else "Pending"),
                "$" + micro_to_usd(int(entry.get("reservedMicroUSD") or 0)) if entry else "-",
                "$" + micro_to_usd(int(settled)) if settled is not None else "-",
                str(status.get("billedSeconds", "-")),
                "platform" if entry.get("platform") else ("agent" if entry else "-"),
                status.get("reason") or "",
            )
        )
    return rows


LEDGER_COLUMNS = ("JOB", "PURPOSE", "PHASE", "RESERVED", "SETTLED", "BILLED_S", "PAYER", "REASON")


def _created(job: Obj | None, name: str) -> tuple[str, str]:
    return ((job or {}).get("metadata", {}).get("creationTimestamp", "~"), name)


LINEAGE_COLUMNS = ("JOB", "READS", "BUILT ON")


def lineage_rows(ep: Obj, jobs: list[Obj]) -> list[tuple[str, ...]]:
    """Each train job that read other jobs' outputs: what it named (inputsFrom) and its whole lineage;
    the submission's row ends at the task's base model, which every train job starts from."""
    submitted = ((ep.get("spec") or {}).get("submission") or {}).get("checkpointFrom")
    rows: list[tuple[str, ...]] = []
    for job in sorted(jobs, key=lambda j: _created(j, j["metadata"]["name"])):
        name = job["metadata"]["name"]
        reads = (job.get("spec") or {}).get("inputsFrom") or []
        if not reads and name != submitted:
            continue
        lineage = [*((job.get("status") or {}).get("lineage") or []), "base model"]
        label = f"{name} (submitted)" if name == submitted else name
        rows.append((label, ", ".join(reads) or "-", " <- ".join(lineage)))
    return rows


def describe(ep: Obj, jobs: list[Obj], now: datetime) -> str:
    status, spec = ep.get("status") or {}, ep.get("spec") or {}
    ledger = status.get("ledger") or {}
    lines = [
        f"Episode:   {ep['metadata']['namespace']}/{ep['metadata']['name']}",
        f"Task:      {spec.get('task')}   Backend: {spec.get('backend')}",
        f"Phase:     {status.get('phase') or 'Pending'}   Outcome: {status.get('outcome') or '-'}"
        f"   Reward: {status.get('reward') if status.get('reward') is not None else '-'}"
        + _interval(status.get("rewardInterval")),
        f"Steps:     {status.get('steps') or 0}   Started: {status.get('startedAt') or '-'}"
        f"   Deadline: {status.get('deadline') or '-'}",
        f"Budget:    ${micro_to_usd(int(ledger.get('budgetMicroUSD') or 0))}"
        f"   Settled: ${micro_to_usd(int(ledger.get('settledMicroUSD') or 0))}"
        f"   Reserved: ${micro_to_usd(int(ledger.get('reservedMicroUSD') or 0))}"
        f"   Platform: ${micro_to_usd(int(ledger.get('platformMicroUSD') or 0))}",
    ]
    integrity = status.get("integrity")
    if integrity:
        used = status.get("devEvaluations") or 0
        lines.append(f"Integrity: {integrity.get('label')}   Dev evaluations: {used}")
        for finding in integrity.get("findings") or []:
            where = ", ".join(finding.get("where") or []) or "-"
            by = finding["check"] + (f" {finding['source']}" if finding.get("source") else "")
            lines.append(f"  {finding['verdict']} ({by}): {finding['summary']} [in: {where}]")
    if status.get("provenance"):
        lines.append(f"Provenance: {provenance_line(status['provenance'], status.get('steps') or 0)}")
    if status.get("orphanedJobs"):
        lines.append("Orphaned:  " + ", ".join(o["name"] for o in status["orphanedJobs"]))
    if status.get("message"):
        lines.append(f"Message:   {status['message']}")
    lines += ["", "Ledger:", table(LEDGER_COLUMNS, ledger_rows(ep, jobs))]
    lineage = lineage_rows(ep, jobs)
    if lineage:
        lines += ["", "Lineage:", table(LINEAGE_COLUMNS, lineage)]
    return "\n".join(lines)


PROVENANCE_COLUMNS = ("AT", "WRITER", "ENTRY", "RESULT", "DETAIL")


def provenance_line(summary: Obj, steps: int) -> str:
    calls = summary.get("toolCalls", 0)
    short = "" if calls >= steps else f" (of {steps} counted: {steps - calls} unrecorded)"
    submission = "submission lineage recorded" if summary.get("submission") else "no submission"
    return (
        f"{calls} tool calls{short}, {summary.get('jobs', 0)} jobs ({summary.get('billedSeconds', 0)} s "
        f"billed), {submission}; tool-call chain {summary.get('chain')}"
    )


def provenance_rows(specs: list[ProvenanceSpec]) -> list[tuple[str, ...]]:
    """One row per entry, in time order: tool calls, jobs as they ended, the submission."""
    rows: list[tuple[str, ...]] = []
    for spec in sorted(specs, key=lambda s: s.sequence):
        for call in spec.tool_calls:
            detail = f"{call.argument_bytes} B args {call.arguments_sha256[:12]}" + (
                f", job {call.job}" if call.job else ""
            )
            rows.append((call.at, "gateway", call.tool, call.result, detail))
        if spec.job is not None:
            job = spec.job
            packages = ", ".join(f"{p.name}=={p.version}" for p in job.packages) or "no packages"
            detail = (
                f"{job.purpose} on {job.flavor}, script {job.script_sha256[:12]}, {packages}, "
                f"{job.billed_seconds or 0} s billed"
                + (f", from {', '.join(job.lineage)}" if job.lineage else "")
            )
            rows.append((job.finished_at or "", "operator", f"job {job.job}", job.phase, detail))
        if spec.submission is not None:
            sub = spec.submission
            chain = " <- ".join([sub.checkpoint_from, *sub.lineage, sub.base_model or "no base model"])
            rows.append((sub.at, "operator", "submission", "-", chain))
    return sorted(rows, key=lambda row: row[0])


def provenance_lines(records: list[Obj]) -> list[str]:
    """The records as JSON Lines (one record each, chain order first), for a judge to read."""
    specs = provenance.specs_of(records)
    ordered = sorted(specs, key=lambda s: (s.writer != "gateway", s.sequence, s.job.job if s.job else ""))
    return [json.dumps({"digest": provenance.digest(s), **s.wire()}, sort_keys=True) for s in ordered]


QUOTA_PERIOD_COLUMNS = ("PERIOD", "JOBS", "SETTLED", "RESERVED", "PLATFORM")


def _usd(figures: Obj, field: str) -> str:
    return "$" + micro_to_usd(int(figures.get(field) or 0))


def describe_quota(quota: Obj | None, namespace: str) -> str:
    """A namespace's BudgetQuota: its terms, the window in force, its conditions and each period."""
    if quota is None:
        return f"No BudgetQuota in namespace {namespace}: each Episode is limited by its own budget only."
    spec, status = quota.get("spec") or {}, quota.get("status") or {}
    period = spec.get("period") or "CalendarMonth"
    if period == "Rolling":
        period += f" ({spec.get('windowDays')} days)"
    anything = "any the backend offers"
    lines = [
        f"BudgetQuota: {namespace}/{quota['metadata']['name']}",
        f"Limit:       ${spec.get('limitUSD')} per {period}",
        f"Window:      {status.get('window') or '- (not applied yet)'}",
        f"Settled:     {_usd(status, 'settledMicroUSD')}   Reserved: {_usd(status, 'reservedMicroUSD')}"
        f"   Remaining: {_usd(status, 'remainingMicroUSD')}   Platform: {_usd(status, 'platformMicroUSD')}",
        f"Episode cap: {'$' + spec['maxEpisodeBudgetUSD'] if spec.get('maxEpisodeBudgetUSD') else 'none'}",
        f"Flavors:     {', '.join(spec['flavors']) if spec.get('flavors') else anything}",
        f"Backends:    {', '.join(spec['backends']) if spec.get('backends') else anything}",
    ]
    for c in status.get("conditions") or []:
        lines.append(
            f"{c['type'] + ':':<12} {c['status']} ({c.get('reason')}) {c.get('message') or ''}".rstrip()
        )
    rows: list[tuple[str, ...]] = [
        (p["period"], str(p.get("jobs") or 0), _usd(p, "settledMicroUSD"), _usd(p, "reservedMicroUSD"),
         _usd(p, "platformMicroUSD"))
        for p in status.get("periods") or []
    ]  # fmt: skip
    if rows:
        lines += ["", "Periods:", table(QUOTA_PERIOD_COLUMNS, rows)]
    return "\n".join(lines)
