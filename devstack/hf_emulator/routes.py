"""Route templates: the keys of request counters and the targets of request faults."""

from __future__ import annotations

import re
from dataclasses import dataclass
from urllib.parse import unquote

WHOAMI = "GET /api/whoami-v2"
AGENT_HARNESSES = "GET /api/agent-harnesses"
HARDWARE = "GET /api/jobs/hardware"
CREATE_JOB = "POST /api/jobs/{namespace}"
LIST_JOBS = "GET /api/jobs/{namespace}"
COUNT_JOBS = "GET /api/jobs/{namespace}/count"
INSPECT_JOB = "GET /api/jobs/{namespace}/{job_id}"
CANCEL_JOB = "POST /api/jobs/{namespace}/{job_id}/cancel"
JOB_LOGS = "GET /api/jobs/{namespace}/{job_id}/logs"
JOB_METRICS = "GET /api/jobs/{namespace}/{job_id}/metrics"
BILLING_USAGE = "GET /api/settings/billing/usage/jobs"
BUCKET_INFO = "GET /api/buckets/{namespace}/{bucket}"
BUCKET_TREE_ROOT = "GET /api/buckets/{namespace}/{bucket}/tree"
BUCKET_TREE = "GET /api/buckets/{namespace}/{bucket}/tree/{path}"
BUCKET_RESOLVE = "GET /buckets/{namespace}/{bucket}/resolve/{path}"
BUCKET_RESOLVE_HEAD = "HEAD /buckets/{namespace}/{bucket}/resolve/{path}"

# Order matters: fixed segments ("hardware", "count") before the parameters they would match.
ALL_ROUTES = (
    WHOAMI,
    AGENT_HARNESSES,
    HARDWARE,
    BILLING_USAGE,
    CREATE_JOB,
    LIST_JOBS,
    COUNT_JOBS,
    INSPECT_JOB,
    CANCEL_JOB,
    JOB_LOGS,
    JOB_METRICS,
    BUCKET_INFO,
    BUCKET_TREE_ROOT,
    BUCKET_TREE,
    BUCKET_RESOLVE,
    BUCKET_RESOLVE_HEAD,
)


@dataclass(frozen=True)
class Match:
    key: str
    params: dict[str, str]


def _compile(template: str) -> re.Pattern[str]:
    pattern = re.sub(
        r"\{(\w+)\}",
        lambda m: f"(?P<{m.group(1)}>.*)" if m.group(1) == "path" else f"(?P<{m.group(1)}>[^/]+)",
        template,
    )
    return re.compile(f"^{pattern}$")


_COMPILED = [(key, key.split(" ", 1)[0], _compile(key.split(" ", 1)[1])) for key in ALL_ROUTES]


def match(method: str, raw_path: str) -> Match | None:
    """Match a percent-encoded path; parameters are returned decoded."""
    for key, route_method, regex in _COMPILED:
        if route_method != method:
            continue
        m = regex.match(raw_path)
        if m:
            return Match(key, {k: unquote(v) for k, v in m.groupdict().items()})
    return None


def unmatched(method: str) -> str:
    return f"{method} <unmatched>"
