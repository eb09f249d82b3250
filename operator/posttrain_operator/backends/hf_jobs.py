"""The `hf-jobs` backend: Hugging Face Jobs through the real `huggingface_hub` client.

The client is synchronous and has no HTTP timeout by default, so every call runs in a worker thread
and the process-wide client factory sets one. `run_job` is not idempotent: the operator labels each
job with its idempotency key and always calls `find` before submitting again.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TypeVar

import httpx2
from huggingface_hub import HfApi, HfFileSystem, JobInfo, Volume, set_client_factory
from huggingface_hub.errors import HfHubHTTPError, JobNotFoundError

from posttrain_operator.backends.base import (
    BACKEND_UNREACHABLE,
    CREDENTIALS_REJECTED,
    ArtifactInfo,
    BackendError,
    CallStats,
    Handle,
    Health,
    JobRequest,
    RemoteStage,
    RemoteStatus,
    UnknownFlavor,
    status_label,
)

T = TypeVar("T")

KEY_LABEL = "posttrain-key"
EPISODE_LABEL = "posttrain-episode"
MANAGED_LABEL = "posttrain-managed-by"
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_STAGES: dict[str, RemoteStage] = {
    "SCHEDULING": "pending",
    "RUNNING": "running",
    "COMPLETED": "succeeded",
    "ERROR": "failed",
    "CANCELED": "cancelled",
    "DELETED": "cancelled",
}
_RETRYABLE_STATUS = {408, 429, 500, 502, 503, 504}
# The platform's status message for a job whose command exited non-zero (HF has no exit-code field).
_FAILED_WITH_CODE = re.compile(r"Job failed with exit code: (\d{1,3})")
_RATE_LIMIT_RESET = re.compile(r"\bt=(\d+)")


def label_value(text: str) -> str:
    """HF label values: [A-Za-z0-9_-], at most 100 characters."""
    return _LABEL_UNSAFE.sub("-", text)[:100]


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


def _request_id(request: httpx2.Request) -> None:
    # What the hub's own (private) hook adds: a trace id per request, for HF's server-side logs.
    request.headers.setdefault("X-Amzn-Trace-Id", str(uuid.uuid4()))


def install_client_timeout(timeout_s: float) -> None:
    """The client's default session has no timeout, and a silent server would block a thread forever.
    Through the public factory, so the client is ours whole: redirects, a request id, a timeout."""
    set_client_factory(
        lambda: httpx2.Client(
            event_hooks={"request": [_request_id]},
            follow_redirects=True,
            timeout=httpx2.Timeout(timeout_s),
        )
    )


def _retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    header = response.headers.get("RateLimit") or ""
    if match := _RATE_LIMIT_RESET.search(header):
        return float(match.group(1))
    retry_after = response.headers.get("Retry-After")
    return float(retry_after) if retry_after and retry_after.isdigit() else None


def _credentials_rejected(exc: Exception) -> bool:
    response = exc.response if isinstance(exc, HfHubHTTPError) else None
    return response is not None and response.status_code in (401, 403)


def _is_transient(exc: Exception) -> bool:
    if isinstance(exc, (httpx2.TimeoutException, httpx2.TransportError, TimeoutError, ConnectionError)):
        return True
    if isinstance(exc, HfHubHTTPError) and exc.response is not None:
        return exc.response.status_code in _RETRYABLE_STATUS
    return False


def _stage_of(info: JobInfo) -> tuple[RemoteStage, str]:
    raw = str(getattr(info.status.stage, "value", info.status.stage))
    return _STAGES.get(raw, "pending"), raw


def _exit_code(stage: RemoteStage, message: str) -> int | None:
    """What HF Jobs says of the exit code: COMPLETED is an exit status of 0, and a command that failed
    is an ERROR whose message names its code. An ERROR for any other cause (a timeout, the platform)
    says nothing of it."""
    if stage == "succeeded":
        return 0
    found = _FAILED_WITH_CODE.fullmatch(message.strip()) if stage == "failed" else None
    return int(found.group(1)) if found else None


def _status_of(info: JobInfo) -> RemoteStatus:
    stage, raw = _stage_of(info)
    message = info.status.message or ""
    return RemoteStatus(
        stage=stage,
        message=message,
        started_at=info.started_at if isinstance(info.started_at, datetime) else None,
        finished_at=info.finished_at if isinstance(info.finished_at, datetime) else None,
        raw_stage=raw,
        exit_code=_exit_code(stage, message),
    )


class HfJobsBackend:
    name = "hf-jobs"

    def __init__(self, config: HfJobsConfig) -> None:
        self.config = config
        self.stats = CallStats()
        self._api = HfApi(endpoint=config.endpoint, token=config.token)
        self._fs = HfFileSystem(endpoint=config.endpoint, token=config.token, skip_instance_cache=True)
        self._prices: dict[str, int] = {}
        self._prices_at = 0.0
        self._prices_lock = asyncio.Lock()

    async def _call(self, method: str, fn: Callable[[], T], *, retry: bool = True) -> T:
        """Run a blocking client call in a thread; retry transient failures with backoff."""
        attempts = self.config.max_attempts if retry else 1
        for attempt in range(1, attempts + 1):
            self.stats.count(method)
            try:
                result = await asyncio.to_thread(fn)
            except JobNotFoundError as exc:
                self.stats.ended(method, status_label(exc))
                raise
            except Exception as exc:
                self.stats.ended(method, status_label(exc))
                if _credentials_rejected(exc):
                    raise BackendError(
                        f"{method}: Hugging Face refused the operator's token: {exc}",
                        transient=False,
                        reason=CREDENTIALS_REJECTED,
                    ) from exc
                if not _is_transient(exc):
                    raise BackendError(f"{method}: {exc}", transient=False) from exc
                if attempt == attempts:
                    raise BackendError(
                        f"{method}: {exc} (after {attempts} attempts)", transient=True
                    ) from exc
                told = _retry_after(exc)
                delay = min(
                    told or min(self.config.max_backoff_s, 0.5 * 2**attempt), self.config.max_backoff_s
                )
                delay *= random.uniform(0.8, 1.2)
                self.stats.retried(method, rate_limited_for=delay if told is not None else None)
                await asyncio.sleep(delay)
            else:
                self.stats.ended(method, "ok")
                return result
        raise AssertionError("unreachable")

    async def check(self) -> Health:
        """Whether the token is accepted (whoami), without running or listing anything."""
        try:
            await self._call("whoami", lambda: self._api.whoami(), retry=False)
        except BackendError as exc:
            return Health(exc.reason, str(exc))
        except Exception as exc:  # the client's own errors on a malformed reply
            return Health(BACKEND_UNREACHABLE, f"whoami: {exc}")
        return Health(None, f"token accepted by {self.config.endpoint}")

    async def price(self, flavor: str) -> int:
        async with self._prices_lock:
            if not self._prices or time.monotonic() - self._prices_at > self.config.price_ttl_s:
                hardware = await self._call("list_jobs_hardware", self._api.list_jobs_hardware)
                self._prices = {h.name: int(h.unit_cost_micro_usd) for h in hardware}
                self._prices_at = time.monotonic()
        if flavor not in self._prices:
            raise UnknownFlavor(flavor, list(self._prices))
        return self._prices[flavor]

    def _volumes(self, request: JobRequest) -> list[Volume]:
        volumes = [
            Volume(
                type=r.kind, source=r.repo_id, revision=r.revision, mount_path=r.mount_path, read_only=True
            )
            for r in request.repos
        ]
        for mount in request.inputs_from:
            volumes.append(
                Volume(
                    type="bucket",
                    source=self.config.bucket,
                    path=mount.prefix,
                    mount_path=mount.mount_path,
                    read_only=True,
                )
            )
        if request.outputs is not None:
            volumes.append(
                Volume(
                    type="bucket",
                    source=self.config.bucket,
                    path=request.outputs.prefix,
                    mount_path=request.outputs.mount_path,
                    read_only=False,
                )
            )
        return volumes

    async def submit(self, request: JobRequest) -> Handle:
        labels = {
            KEY_LABEL: label_value(request.key),
            EPISODE_LABEL: label_value(f"{request.namespace}-{request.episode}"),
            MANAGED_LABEL: label_value(self.config.instance),
        }
        # The spec travels in the environment; it is the agent's own script and packages, never a
        # credential. `secrets` stays empty: jobs get no token of any kind.
        env = {"POSTTRAIN_JOB_SPEC": json.dumps(request.launcher_spec, separators=(",", ":"))}
        info = await self._call(
            "run_job",
            lambda: self._api.run_job(
                image=request.image or self.config.image,
                command=["python", "-m", "posttrain_launcher"],
                env=env,
                secrets={},
                flavor=request.flavor,
                timeout=request.timeout_seconds,
                labels=labels,
                volumes=self._volumes(request),
                namespace=self.config.namespace,
            ),
            retry=False,  # not idempotent: the caller finds by key before any retry
        )
        return Handle(info.id, request.outputs.prefix if request.outputs else "")

    async def find(self, key: str) -> Handle | None:
        jobs = await self._call(
            "list_jobs",
            lambda: list(
                self._api.list_jobs(labels={KEY_LABEL: label_value(key)}, namespace=self.config.namespace)
            ),
        )
        if not jobs:
            return None
        # Two jobs with one key would be a bug upstream of us; the oldest is the one we track.
        first = min(jobs, key=lambda j: j.created_at or datetime.max)
        return Handle(first.id)

    async def status_many(self, handles: Sequence[Handle]) -> dict[str, RemoteStatus]:
        """One list call for everything still active; one inspect per job that left that list."""
        if not handles:
            return {}
        active = await self._call(
            "list_jobs",
            lambda: list(
                self._api.list_jobs(
                    status=["SCHEDULING", "RUNNING"],
                    labels={MANAGED_LABEL: label_value(self.config.instance)},
                    namespace=self.config.namespace,
                )
            ),
        )
        statuses = {info.id: _status_of(info) for info in active}
        wanted = {h.backend_job_id for h in handles}
        for job_id in wanted - statuses.keys():
            statuses[job_id] = await self._inspect(job_id)
        return {job_id: statuses[job_id] for job_id in wanted}

    async def _inspect(self, job_id: str) -> RemoteStatus:
        try:
            info = await self._call(
                "inspect_job", lambda: self._api.inspect_job(job_id=job_id, namespace=self.config.namespace)
            )
        except JobNotFoundError:
            return RemoteStatus(stage="lost", message=f"backend job {job_id} no longer exists")
        return _status_of(info)

    async def cancel(self, handle: Handle) -> bool:
        status = await self._inspect(handle.backend_job_id)
        if status.stage in ("succeeded", "failed", "cancelled", "lost"):
            return True
        try:
            await self._call(
                "cancel_job",
                lambda: self._api.cancel_job(job_id=handle.backend_job_id, namespace=self.config.namespace),
            )
        except JobNotFoundError:
            return True
        # A 200 is not a confirmation: only an inspected terminal stage is.
        after = await self._inspect(handle.backend_job_id)
        return after.stage in ("succeeded", "failed", "cancelled", "lost")

    async def logs(self, handle: Handle, tail: int) -> list[str]:
        def fetch() -> list[str]:
            lines = self._api.fetch_job_logs(
                job_id=handle.backend_job_id, namespace=self.config.namespace, follow=False, tail=tail
            )
            return list(lines)[-tail:]

        try:
            return await self._call("fetch_job_logs", fetch)
        except JobNotFoundError:
            return []  # a vanished job has no logs to show

    def _bucket_path(self, output_prefix: str, path: str = "") -> str:
        return "/".join(p for p in (f"buckets/{self.config.bucket}", output_prefix, path) if p)

    async def artifacts(self, output_prefix: str) -> list[ArtifactInfo]:
        root = self._bucket_path(output_prefix)

        def walk() -> list[ArtifactInfo]:
            try:
                found: dict[str, dict[str, Any]] = self._fs.find(root, detail=True)  # type: ignore[assignment]
            except FileNotFoundError:
                return []
            return [
                ArtifactInfo(path=name[len(root) :].lstrip("/"), size=int(info.get("size") or 0))
                for name, info in sorted(found.items())
                if info.get("type") == "file"
            ]

        return await self._call("bucket_tree", walk)

    async def read_artifact(self, output_prefix: str, path: str, max_bytes: int) -> bytes:
        if ".." in path.split("/"):
            raise BackendError(f"artifact path may not contain '..': {path!r}", transient=False)
        target = self._bucket_path(output_prefix, path)

        def read() -> bytes:
            with self._fs.open(target, "rb") as handle:
                data: Any = handle.read(max_bytes + 1)
            return bytes(data)

        try:
            data = await self._call("bucket_resolve", read)
        except BackendError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                raise FileNotFoundError(path) from exc
            raise
        if len(data) > max_bytes:
            raise BackendError(f"artifact {path} is larger than {max_bytes} bytes", transient=False)
        return data
