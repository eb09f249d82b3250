"""Self-contained HTML reports (figures inlined as PNG) of one episode or of a namespace's episodes.

One episode: a timeline of its jobs (one bar per job from creation to finish, grouped by purpose,
coloured by outcome), its cumulative settled spend against the budget, its jobs and steps over time,
and the final reward. A namespace: a table of its episodes and reward against spend.
"""

from __future__ import annotations

import base64
import html
import io
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: reports are files

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from posttrain_operator.api import provenance
from posttrain_operator.api.money import micro_to_usd
from posttrain_operator.api.rules import parse_time

from posttrain_cli.views import (
    EPISODE_COLUMNS,
    LEDGER_COLUMNS,
    LINEAGE_COLUMNS,
    PROVENANCE_COLUMNS,
    episode_row,
    ledger_rows,
    lineage_rows,
    provenance_line,
    provenance_rows,
)

Obj = dict[str, Any]
PHASE_COLORS = {
    "Succeeded": "#2ca02c",
    "Failed": "#d62728",
    "Cancelled": "#7f7f7f",
    "Rejected": "#ff7f0e",
    "Orphaned": "#8c564b",
    "Running": "#1f77b4",
    "Admitted": "#17becf",
    "Pending": "#bcbd22",
}
SPEND_COLOR = "#9467bd"
BUDGET_COLOR = "#000000"
STEPS_COLOR = "#e377c2"
PURPOSE_ORDER = ("train", "devEval", "score")


@dataclass(frozen=True)
class Bar:
    name: str
    purpose: str
    phase: str
    start: float  # seconds since the episode began
    end: float
    settled_micro_usd: int


def _seconds(moment: str | None, origin: datetime) -> float | None:
    when = parse_time(moment)
    return None if when is None else (when - origin).total_seconds()


def episode_origin(ep: Obj) -> datetime:
    status = ep.get("status") or {}
    origin = parse_time(status.get("startedAt")) or parse_time(ep["metadata"]["creationTimestamp"])
    assert origin is not None
    return origin


def bars(ep: Obj, jobs: list[Obj], now: datetime) -> list[Bar]:
    origin, found = episode_origin(ep), []
    for job in jobs:
        status = job.get("status") or {}
        start = _seconds(job["metadata"]["creationTimestamp"], origin) or 0.0
        end = _seconds(status.get("finishedAt"), origin)
        if end is None:
            phase = status.get("phase") or "Pending"
            end = start if phase == "Rejected" else (now - origin).total_seconds()
        found.append(
            Bar(
                job["metadata"]["name"],
                (job.get("spec") or {}).get("purpose", "train"),
                status.get("phase") or "Pending",
                start,
                max(end, start),
                int(status.get("settledMicroUSD") or 0),
            )
        )
    return found


def spend_curve(ep: Obj, found: list[Bar]) -> list[tuple[float, int]]:
    """Cumulative agent spend in micro-dollars as each job settled (grader jobs are platform spend)."""
    points, total = [(0.0, 0)], 0
    for bar in sorted(
        (b for b in found if b.purpose != "score" and b.settled_micro_usd), key=lambda b: b.end
    ):
        points.append((bar.end, total))
        total += bar.settled_micro_usd
        points.append((bar.end, total))
    return points


def _png(fig: Figure) -> bytes:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    return buffer.getvalue()


def episode_figure(ep: Obj, jobs: list[Obj], now: datetime) -> bytes:
    """The episode's figure as PNG bytes: the jobs' timeline, the cumulative spend against the
    budget, and the jobs submitted against the steps counted. The three panels share their x axis and
    span, drawn in order, one function each."""
    status = ep.get("status") or {}
    ledger = status.get("ledger") or {}
    budget = int(ledger.get("budgetMicroUSD") or 0)
    found = bars(ep, jobs, now)
    span = max([b.end for b in found] + [1.0])
    fig, (timeline, spend, steps) = plt.subplots(3, 1, figsize=(10, 9), sharex=True, constrained_layout=True)
    timeline.set_xlim(0, span * 1.02)
    reward = status.get("reward")
    fig.suptitle(
        f"{ep['metadata']['name']}: {status.get('outcome') or status.get('phase') or 'Pending'}, "
        f"reward {reward if reward is not None else '-'}"
    )

    _timeline_panel(timeline, found, span)
    _spend_panel(spend, ep, found, span, budget)
    _steps_panel(steps, found, span, int(status.get("steps") or 0))
    return _png(fig)


def _timeline_panel(timeline: Axes, found: list[Bar], span: float) -> None:
    ordered = sorted(found, key=lambda b: (_purpose_rank(b.purpose), b.start, b.name))
    for row, bar in enumerate(ordered):
        width = max(bar.end - bar.start, span * 0.01)  # a job shorter than a pixel still shows
        timeline.barh(row, width, left=bar.start, height=0.7, color=PHASE_COLORS.get(bar.phase, "#333333"))
    timeline.set_yticks(range(len(ordered)), [f"{b.purpose}: {b.name}" for b in ordered], fontsize=7)
    timeline.invert_yaxis()
    timeline.set_xlabel("seconds since the episode started")
    timeline.set_title("jobs (creation to finish), by purpose and outcome")
    seen = sorted({b.phase for b in found})
    if seen:
        timeline.legend(
            handles=[Patch(color=PHASE_COLORS.get(p, "#333333"), label=p) for p in seen], fontsize=7
        )


def _spend_panel(spend: Axes, ep: Obj, found: list[Bar], span: float, budget: int) -> None:
    curve = spend_curve(ep, found)
    curve.append((span, curve[-1][1]))
    spend.plot(
        [t for t, _ in curve], [m / 1e6 for _, m in curve], color=SPEND_COLOR, linewidth=3, label="settled"
    )
    spent = curve[-1][1]
    title = f"cumulative spend: {micro_to_usd(spent)} of the {micro_to_usd(budget)} USD budget"
    if spent and spent * 10 < budget:
        # A line along the axis says nothing: scale to the spend, and say where the budget is.
        spend.set_ylim(0, spent * 1.3 / 1e6)
        title += f" ({budget / spent:.0f}x the spend, above this scale)"
    else:
        spend.axhline(budget / 1e6, color=BUDGET_COLOR, linestyle="--", linewidth=1.5, label="budget")
        spend.set_ylim(bottom=0)
    spend.set_ylabel("USD")
    spend.set_xlabel("seconds since the episode started")
    spend.set_title(title)
    spend.legend(fontsize=7)


def _steps_panel(steps: Axes, found: list[Bar], span: float, final_steps: int) -> None:
    agent = sorted(b.start for b in found if b.purpose != "score")
    xs, ys = [0.0], [0]
    for i, start in enumerate(agent, 1):
        xs += [start, start]
        ys += [i - 1, i]
    xs.append(span)
    ys.append(ys[-1])
    steps.plot(xs, ys, color=STEPS_COLOR, linewidth=2, label="jobs submitted")
    steps.scatter(
        [span], [final_steps], color=BUDGET_COLOR, zorder=3, label=f"steps at the end: {final_steps}"
    )
    steps.set_title("jobs submitted over time (each a tool call), and the steps counted")
    steps.set_xlabel("seconds since the episode started")
    steps.legend(fontsize=7)


def _purpose_rank(purpose: str) -> int:
    return PURPOSE_ORDER.index(purpose) if purpose in PURPOSE_ORDER else len(PURPOSE_ORDER)


def _table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


STYLE = (
    "body{font-family:sans-serif;margin:2em;max-width:1100px}table{border-collapse:collapse;font-size:13px}"
    "td,th{border:1px solid #ccc;padding:3px 8px;text-align:left}img{max-width:100%}"
)


def _page(title: str, body: str) -> str:
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>{body}</body></html>"
    )


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def episode_report(ep: Obj, jobs: list[Obj], records: list[Obj], now: datetime) -> tuple[str, bytes]:
    """The HTML page and its figure (also inlined in the page)."""
    png = episode_figure(ep, jobs, now)
    summary = _table(EPISODE_COLUMNS, [episode_row(ep, now)])
    specs = provenance.specs_of(records)
    steps = int((ep.get("status") or {}).get("steps") or 0)
    recorded = provenance_line(provenance.summarise(specs).wire(), steps)
    body = (
        f"{summary}<h2>Timeline, spend and steps</h2>{_img(png, 'episode timeline')}"
        f"<h2>Ledger per job</h2>{_table(LEDGER_COLUMNS, ledger_rows(ep, jobs))}"
        f"<h2>Lineage</h2>{_table(LINEAGE_COLUMNS, lineage_rows(ep, jobs))}"
        f"<h2>Provenance</h2><p>{html.escape(recorded)}</p>"
        f"{_table(PROVENANCE_COLUMNS, provenance_rows(specs))}"
        f"<p>Generated {now.isoformat(timespec='seconds')}.</p>"
    )
    return _page(f"Episode {ep['metadata']['namespace']}/{ep['metadata']['name']}", body), png


def namespace_figure(episodes: list[Obj]) -> bytes:
    fig, ax = plt.subplots(figsize=(8, 5), constrained_layout=True)
    by_outcome: dict[str, list[tuple[float, float]]] = {}
    for ep in episodes:
        status = ep.get("status") or {}
        if status.get("reward") is None:
            continue  # unscored, or a platform failure: no point to place
        spent = int((status.get("ledger") or {}).get("settledMicroUSD") or 0) / 1e6
        by_outcome.setdefault(status.get("outcome") or "-", []).append((spent, float(status["reward"])))
    for outcome, points in sorted(by_outcome.items()):
        ax.scatter([p[0] for p in points], [p[1] for p in points], label=outcome, s=40)
    ax.set_xlabel("settled spend (USD)")
    ax.set_ylabel("reward")
    ax.set_title(f"reward against spend, {sum(len(p) for p in by_outcome.values())} scored episodes")
    if by_outcome:
        ax.legend(fontsize=8)
    return _png(fig)


def namespace_report(namespace: str, episodes: list[Obj], now: datetime) -> tuple[str, bytes]:
    png = namespace_figure(episodes)
    rows = [episode_row(ep, now) for ep in episodes]
    body = f"{_img(png, 'reward against spend')}<h2>Episodes</h2>{_table(EPISODE_COLUMNS, rows)}"
    return _page(f"Episodes in {namespace}", body), png
