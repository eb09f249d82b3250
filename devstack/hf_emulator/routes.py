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
# The Hub's repository API (`hub_api.py`); {repo_type} is "models", "datasets" or "spaces".
CREATE_REPO = "POST /api/repos/create"
REPO_INFO = "GET /api/{repo_type}/{namespace}/{repo}"
REPO_INFO_AT = "GET /api/{repo_type}/{namespace}/{repo}/revision/{revision}"
REPO_REFS = "GET /api/{repo_type}/{namespace}/{repo}/refs"
REPO_TREE_ROOT = "GET /api/{repo_type}/{namespace}/{repo}/tree/{revision}"
REPO_TREE = "GET /api/{repo_type}/{namespace}/{repo}/tree/{revision}/{path}"
PREUPLOAD = "POST /api/{repo_type}/{namespace}/{repo}/preupload/{revision}"
COMMIT = "POST /api/{repo_type}/{namespace}/{repo}/commit/{revision}"
CREATE_TAG = "POST /api/{repo_type}/{namespace}/{repo}/tag/{revision}"
# A file of a repo at a revision, as `hf_hub_download` (and so `snapshot_download`) fetches it: models
# have no type in the path, datasets and spaces do.
FILE_RESOLVE = "GET /{repo_type}/{namespace}/{repo}/resolve/{revision}/{path}"
FILE_RESOLVE_HEAD = "HEAD /{repo_type}/{namespace}/{repo}/resolve/{revision}/{path}"
MODEL_FILE_RESOLVE = "GET /{namespace}/{repo}/resolve/{revision}/{path}"
MODEL_FILE_RESOLVE_HEAD = "HEAD /{namespace}/{repo}/resolve/{revision}/{path}"
FILE_ROUTES = (FILE_RESOLVE, FILE_RESOLVE_HEAD, MODEL_FILE_RESOLVE, MODEL_FILE_RESOLVE_HEAD)
HUB_ROUTES = (
    CREATE_REPO,
    REPO_INFO,
    REPO_INFO_AT,
    REPO_REFS,
    REPO_TREE_ROOT,
    REPO_TREE,
    PREUPLOAD,
    COMMIT,
    CREATE_TAG,
)

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
    *HUB_ROUTES,
    *FILE_ROUTES,
)


@dataclass(frozen=True)
class Match:
    key: str
    params: dict[str, str]


_PARAM_PATTERNS = {"path": ".*", "repo_type": "models|datasets|spaces"}


def _compile(template: str) -> re.Pattern[str]:
    pattern = re.sub(
        r"\{(\w+)\}",
        lambda m: f"(?P<{m.group(1)}>{_PARAM_PATTERNS.get(m.group(1), '[^/]+')})",
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
