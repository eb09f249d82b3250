"""What the emulator records and reports of its use: the requests it served, and each job's billing
(per started minute of running time), as `GET /api/settings/billing/usage/jobs` shows it; and the
samples of a running job's metrics stream."""

from __future__ import annotations

import contextlib
import os
import time
from collections import Counter, deque
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from devstack.hf_emulator.hardware import FLAVORS
from devstack.hf_emulator.job_state import Job, iso_z

MAX_RECORDED_REQUESTS = 100_000
# A commit's body carries whole files; the log keeps its start (every Jobs API body fits whole).
MAX_RECORDED_BODY_BYTES = 1 << 20
REDACTED_TOKEN = "[token]"


@dataclass(frozen=True)
class RecordedRequest:
    method: str
    path: str  # with the query string
    route: str
    headers: list[tuple[str, str]]
    body: bytes
    at: float

    def to_wire(self, token: str) -> dict[str, Any]:
        """As served over HTTP: every occurrence of `token` reads REDACTED_TOKEN, so a leak scan over
        HTTP still sees where it was, and the request log never hands the token out."""

        def redact(text: str) -> str:
            return text.replace(token, REDACTED_TOKEN) if token else text

        return {
            "method": self.method,
            "path": redact(self.path),
            "route": self.route,
            "headers": [[name, redact(value)] for name, value in self.headers],
            "body": redact(self.body.decode("utf-8", "replace")),
            "at": iso_z(self.at),
        }


@dataclass(frozen=True)
class BillingRecord:
    job_id: str
    namespace: str
    flavor: str
    minutes: int
    cost_micro_usd: int
    started_at: float | None
    finished_at: float | None

    def to_wire(self) -> dict[str, Any]:
        return {
            "jobId": self.job_id,
            "namespace": self.namespace,
            "hardwareFlavor": self.flavor,
            "totalMinutes": self.minutes,
            "totalCostMicroUsd": self.cost_micro_usd,
            "startedAt": iso_z(self.started_at) if self.started_at else None,
            "completedAt": iso_z(self.finished_at) if self.finished_at else None,
        }


@dataclass
class Stats:
    counts: Counter[str] = field(default_factory=Counter)
    # Bounded so that a long benchmark cannot exhaust memory; the counters are exact regardless.
    requests: deque[RecordedRequest] = field(default_factory=lambda: deque(maxlen=MAX_RECORDED_REQUESTS))
    creations: dict[str, Counter[str]] = field(default_factory=dict)


def billing_usage(records: list[BillingRecord], today: datetime | None = None) -> dict[str, Any]:
    """The billing usage of this month: jobs that started, their minutes and cost."""
    records = [r for r in records if r.started_at is not None]
    today = today or datetime.now(UTC)
    start = today.replace(day=1, hour=0, minute=0, second=0, microsecond=0)
    end = (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )
    return {
        "usage": {
            "usedMicroUsd": sum(r.cost_micro_usd for r in records),
            "totalMinutes": sum(r.minutes for r in records),
            "periodStart": iso_z(start.timestamp()),
            "periodEnd": iso_z(end.timestamp()),
            "jobDetails": [
                {k: v for k, v in r.to_wire().items() if k != "namespace" and v is not None} for r in records
            ],
        },
        "hasAccess": True,
    }


def metrics_sample(job: Job, prev: tuple[float, float] | None) -> tuple[dict[str, Any], tuple[float, float]]:
    """One sample of a running job's metrics, and what the next one measures CPU use from."""
    cpu_secs, rss = 0.0, 0
    if job.cgroup is not None:
        with contextlib.suppress(OSError, ValueError):
            cpu_secs, rss = job.cgroup.cpu_seconds(), job.cgroup.memory_usage()
    elif job.proc is not None:
        try:
            fields = Path(f"/proc/{job.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
            ticks = os.sysconf("SC_CLK_TCK")
            cpu_secs = (int(fields[11]) + int(fields[12])) / ticks
            rss = int(fields[21]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    now = time.monotonic()
    pct = 0.0
    if prev is not None and now > prev[0]:
        pct = 100.0 * (cpu_secs - prev[1]) / (now - prev[0])
    flavor = FLAVORS[job.spec.flavor]
    sample = {
        "cpu_usage_pct": round(pct, 1),
        "cpu_millicores": flavor.cpu_cores * 1000,
        "memory_used_bytes": rss,
        "memory_total_bytes": int(flavor.ram.split()[0]) * 1024**3,
        "rx_bps": 0,
        "tx_bps": 0,
        "gpus": {},
        "replica": job.id[-5:],
    }
    return sample, (now, cpu_secs)
