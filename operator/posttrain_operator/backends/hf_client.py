"""The HF Jobs backend's configuration, its labels on jobs, and the process's HTTP client for the
`huggingface_hub` calls: a timeout (the client has none by default), a request id, and every request
counted, each page of a list included (what a provider's rate limit counts)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from dataclasses import dataclass

import httpx2
from huggingface_hub import set_client_factory

from posttrain_operator.backends.base import CallStats

KEY_LABEL = "posttrain-key"
EPISODE_LABEL = "posttrain-episode"
MANAGED_LABEL = "posttrain-managed-by"


@dataclass(frozen=True)
class HfJobsConfig:
    endpoint: str
    token: str
    namespace: str
    image: str
    bucket: str  # "<namespace>/<name>": where job outputs live
    instance: str = "posttrain-operator"  # the managed-by label: which operator owns a job
    http_timeout_s: float = 30.0
    price_ttl_s: float = 600.0
    max_attempts: int = 5
    max_backoff_s: float = 30.0
    # Where the operator resolves jobs' `packages` (a PEP 503/691 index, e.g. PyPI's simple API) and
    # the private dataset repo it commits their wheels to; None: jobs with packages are refused.
    package_index: str | None = None
    package_repo: str | None = None  # default "<namespace>/posttrain-packages"
    package_arch: str = "x86_64"
    max_package_bytes: int = 1 << 30
    staging_dir: str | None = None  # where wheels are downloaded before the commit (None: the temp dir)


def _request_id(request: httpx2.Request) -> None:
    # What the hub's own (private) hook adds: a trace id per request, for HF's server-side logs.
    request.headers.setdefault("X-Amzn-Trace-Id", str(uuid.uuid4()))


def install_client_timeout(timeout_s: float, stats: CallStats | None = None) -> None:
    """The client's default session has no timeout, and a silent server would block a thread forever.
    Through the public factory, so the client is ours whole: redirects, a request id, a timeout, and
    every request (each page of a list) counted on `stats`. The factory is the process's: one backend."""
    hooks: list[Callable[[httpx2.Request], None]] = [_request_id]
    if stats is not None:
        hooks.append(lambda _request: stats.sent())
    set_client_factory(
        lambda: httpx2.Client(
            event_hooks={"request": hooks},
            follow_redirects=True,
            timeout=httpx2.Timeout(timeout_s),
        )
    )
