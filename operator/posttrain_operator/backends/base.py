"""The backend protocol: everything the operator needs from a place that runs jobs.

Backends own no Kubernetes state and make no ledger decisions; they translate a `JobRequest` into
their own API and report back in `RemoteStatus`. Every method is async and never blocks the loop.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

RemoteStage = Literal["pending", "running", "succeeded", "failed", "cancelled", "lost"]
TERMINAL_STAGES: frozenset[str] = frozenset({"succeeded", "failed", "cancelled", "lost"})


# Why a backend call failed, as a condition reason a human can act on.
CREDENTIALS_REJECTED = "CredentialsRejected"  # the backend refused the operator's token (401/403)
CREDENTIALS_MISSING = "CredentialsMissing"  # the operator has no readable token for the backend
BACKEND_UNREACHABLE = "BackendUnreachable"  # timeouts, refused connections, 5xx, rate limits
BACKEND_REFUSED = "BackendRefused"  # any other refusal (a bad request, an unknown repo)


class BackendError(RuntimeError):
    """The backend refused or failed a call. `transient` errors are worth retrying later; `reason`
    says why in a word clients match on."""

    def __init__(self, message: str, *, transient: bool, reason: str | None = None) -> None:
        super().__init__(message)
        self.transient = transient
        self.reason = reason or (BACKEND_UNREACHABLE if transient else BACKEND_REFUSED)


class UnknownFlavor(BackendError):
    def __init__(self, flavor: str, known: Sequence[str]) -> None:
        super().__init__(
            f"unknown flavor {flavor!r}; this backend offers: {', '.join(sorted(known))}", transient=False
        )


@dataclass(frozen=True)
class RepoMount:
    """A pinned Hub repository mounted read-only at `mount_path`."""

    kind: Literal["model", "dataset"]
    repo_id: str
    revision: str
    mount_path: str


@dataclass(frozen=True)
class OutputMount:
    """A job's outputs: `prefix` identifies them in the backend's artifact store."""

    prefix: str
    mount_path: str
    read_only: bool = False


@dataclass(frozen=True)
class StagedWheels:
    key: str  # the job's idempotency key, under which its backend staged its packages' wheels
    mount_path: str


@dataclass(frozen=True)
class JobRequest:
    key: str  # idempotency key: the backend labels the job with it and finds it by it
    namespace: str  # Kubernetes namespace of the AgentJob
    episode: str
    job_name: str
    flavor: str
    timeout_seconds: int
    launcher_spec: dict[str, Any]
    repos: tuple[RepoMount, ...] = ()
    outputs: OutputMount | None = None
    inputs_from: tuple[OutputMount, ...] = ()  # other jobs' outputs, read-only (checkpoints)
    # Other jobs' staged wheels, read-only: what a score job screens (the backend knows where it
    # staged each job's wheels, by its key).
    wheels_from: tuple[StagedWheels, ...] = ()
    scratch_bytes: int | None = None  # HOME and TMPDIR in all, where the backend bounds them
    image: str | None = None  # the task's environment image; None: the backend's launcher image
    environment: str | None = None  # that image's name (what it holds: backends/image_packages.py)


# The variables the launcher reads its spec from: one, or parts past what one variable may hold (Linux
# refuses to exec with a variable over 128 KiB; a script may be 256 KiB). The launcher's
# `posttrain_launcher.spec` joins them; the operator's image does not hold the launcher, so the
# format is written here too, and a unit test holds the two to each other.
SPEC_ENV = "POSTTRAIN_JOB_SPEC"
SPEC_PART_CHARS = 30_000


def launcher_env(request: JobRequest) -> dict[str, str]:
    """The job's spec for its launcher: the agent's own script and packages, never a credential."""
    text = json.dumps(request.launcher_spec, separators=(",", ":"))
    if len(text) <= SPEC_PART_CHARS:
        return {SPEC_ENV: text}
    parts = [text[start : start + SPEC_PART_CHARS] for start in range(0, len(text), SPEC_PART_CHARS)]
    return {f"{SPEC_ENV}_PARTS": str(len(parts)), **{f"{SPEC_ENV}_{i}": part for i, part in enumerate(parts)}}


@dataclass(frozen=True)
class Handle:
    backend_job_id: str
    output_prefix: str = ""
    # The wheels installed for the job's packages, dependencies included, as the backend resolved and
    # staged them (recorded in the job's status); empty where the backend resolves none.
    packages: tuple[PackagePin, ...] = ()


@dataclass(frozen=True)
class PackagePin:
    name: str
    version: str
    sha256: str


@dataclass(frozen=True)
class RemoteStatus:
    stage: RemoteStage
    message: str = ""
    started_at: datetime | None = None
    finished_at: datetime | None = None
    raw_stage: str = ""
    # The job process's, once it ended, where the backend tells it (pods: the container's; HF Jobs: 0
    # for COMPLETED, else the code its failure message names); None where it does not.
    exit_code: int | None = None
    # What the job's launcher found when it checked, from inside its pod, that its network was
    # closed (pods only): True verified, False open (the job did not run), None not reported.
    egress_verified: bool | None = None
    egress_message: str = ""
    # Where the job's process ran (pods only): its pod's RuntimeClass ("" for the node's default), and
    # the kernel its launcher saw before any job code (gVisor reports its own).
    runtime_class: str | None = None
    kernel: str = ""


@dataclass(frozen=True)
class ArtifactInfo:
    path: str
    size: int


@dataclass
class CallStats:
    """Backend API calls made, by method (what the benchmarks read), and how they ended, the retries
    and the rate-limit waits (what the operator's metrics expose)."""

    calls: dict[str, int] = field(default_factory=dict)
    outcomes: dict[tuple[str, str], int] = field(default_factory=dict)  # (method, "ok" | HTTP status | error)
    retries: dict[str, int] = field(default_factory=dict)
    rate_limit_waits: int = 0
    rate_limit_wait_seconds: float = 0.0
    # HTTP requests sent, pages included (a list of 10,000 jobs is one call and 200 requests): what a
    # provider's rate limit counts, and what the poller paces its passes by.
    http_requests: int = 0

    def sent(self) -> None:
        self.http_requests += 1

    def count(self, method: str) -> None:
        self.calls[method] = self.calls.get(method, 0) + 1

    def ended(self, method: str, status: str) -> None:
        self.outcomes[(method, status)] = self.outcomes.get((method, status), 0) + 1

    def retried(self, method: str, rate_limited_for: float | None = None) -> None:
        self.retries[method] = self.retries.get(method, 0) + 1
        if rate_limited_for is not None:
            self.rate_limit_waits += 1
            self.rate_limit_wait_seconds += rate_limited_for


def status_label(exc: BaseException) -> str:
    """A bounded label for how a call failed: its HTTP status when it had one, else the error class."""
    response = getattr(exc, "response", None)
    code = getattr(response, "status_code", None) or getattr(exc, "status", None)
    if isinstance(code, int) and 100 <= code <= 599:
        return str(code)
    if isinstance(exc, TimeoutError) or "Timeout" in type(exc).__name__:
        return "timeout"
    return "error"


class Backend(Protocol):
    name: str
    stats: CallStats

    async def price(self, flavor: str) -> int:
        """Micro-dollars per minute for `flavor`; raises UnknownFlavor."""
        ...

    async def submit(self, request: JobRequest) -> Handle: ...

    async def find(self, key: str) -> Handle | None: ...

    async def status_many(self, handles: Sequence[Handle]) -> dict[str, RemoteStatus]:
        """Status of the handles, by backend_job_id, at a cost that does not grow with their number.
        A handle left out is unknown this time (a transient failure), never "lost"; raises when
        nothing could be learned."""
        ...

    async def cancel(self, handle: Handle) -> bool:
        """Idempotent; True only when the backend confirms the job is no longer running."""
        ...

    async def logs(self, handle: Handle, tail: int) -> list[str]: ...

    async def artifacts(self, output_prefix: str) -> list[ArtifactInfo]: ...

    async def read_artifact(self, output_prefix: str, path: str, max_bytes: int) -> bytes: ...


@dataclass(frozen=True)
class Health:
    """What a backend's start-up check found: `reason` is None when its credentials were accepted."""

    reason: str | None
    message: str

    @property
    def ok(self) -> bool:
        return self.reason is None


@runtime_checkable
class SupportsHealthCheck(Protocol):
    """Backends whose credentials can be checked without running anything (the token never appears
    in the result)."""

    async def check(self) -> Health: ...


@runtime_checkable
class SupportsEpisodeCleanup(Protocol):
    """Backends that hold per-episode resources (the pods backend's namespace) release them here,
    once every job of the episode is confirmed gone."""

    async def release_episode(self, namespace: str, episode: str) -> bool: ...
