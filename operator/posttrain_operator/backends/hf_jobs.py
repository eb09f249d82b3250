"""The `hf-jobs` backend: Hugging Face Jobs through the real `huggingface_hub` client.

The client is synchronous and has no HTTP timeout by default, so every call runs in a worker thread
and the process-wide client factory sets one. `run_job` is not idempotent: the operator labels each
job with its idempotency key and always calls `find` before submitting again.
"""

from __future__ import annotations

import asyncio
import functools
import random
import tempfile
import time
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any, TypeVar

from huggingface_hub import HfApi, HfFileSystem, Volume
from huggingface_hub.errors import JobNotFoundError

from posttrain_operator.backends.base import (
    BACKEND_UNREACHABLE,
    CREDENTIALS_REJECTED,
    ArtifactInfo,
    BackendError,
    CallStats,
    Handle,
    Health,
    JobRequest,
    PackagePin,
    RemoteStatus,
    UnknownFlavor,
    launcher_env,
    status_label,
)
from posttrain_operator.backends.hf_client import EPISODE_LABEL, KEY_LABEL, MANAGED_LABEL, HfJobsConfig
from posttrain_operator.backends.hf_replies import (
    credentials_rejected,
    is_transient,
    label_value,
    retry_after,
    status_of,
)
from posttrain_operator.backends.wheels import (
    WHEELS_MOUNT,
    install_env,
    packages_to_stage,
    stage_job_packages,
)

T = TypeVar("T")


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
        self._prices_failure: tuple[float, str] | None = None  # when the last lookup failed, and why
        self._staging = asyncio.Semaphore(2)
        self._list_requests = 1  # what the last list of active jobs cost, in requests (its pages)

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
                if credentials_rejected(exc):
                    raise BackendError(
                        f"{method}: Hugging Face refused the operator's token: {exc}",
                        transient=False,
                        reason=CREDENTIALS_REJECTED,
                    ) from exc
                if not is_transient(exc):
                    raise BackendError(f"{method}: {exc}", transient=False) from exc
                if attempt == attempts:
                    raise BackendError(
                        f"{method}: {exc} (after {attempts} attempts)", transient=True
                    ) from exc
                told = retry_after(exc)
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
        asked_at = time.monotonic()
        async with self._prices_lock:
            # A lookup that failed while this call waited for the lock is this call's answer too: callers
            # queued behind a backend that does not answer share its retries rather than repeat them.
            if self._prices_failure is not None and self._prices_failure[0] >= asked_at:
                raise BackendError(self._prices_failure[1], transient=True)
            if not self._prices or time.monotonic() - self._prices_at > self.config.price_ttl_s:
                try:
                    hardware = await self._call("list_jobs_hardware", self._api.list_jobs_hardware)
                except BackendError as exc:
                    if exc.transient:  # a refusal is not shared: the next caller sees it for itself
                        self._prices_failure = (time.monotonic(), str(exc))
                    raise
                self._prices_failure = None
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
        for staged in request.wheels_from:  # where _stage_packages committed that job's wheels
            volumes.append(
                Volume(
                    type="dataset",
                    source=self._package_repo(),
                    path=self._wheels_folder(staged.key),
                    mount_path=staged.mount_path,
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

    async def _stage_packages(
        self, request: JobRequest, packages: Sequence[str]
    ) -> tuple[list[PackagePin], Volume]:
        """The job's wheels, resolved here (wheels.py), committed to the private package repo under the
        job's key and mounted read-only at that commit: the job never reaches an index itself. Two
        stagings at a time: the staging disk holds two jobs' wheels at most (the chart sizes it)."""
        assert self.config.package_index is not None
        repo, folder = self._package_repo(), self._wheels_folder(request.key)
        async with self._staging:
            with tempfile.TemporaryDirectory(prefix="posttrain-wheels-", dir=self.config.staging_dir) as tmp:
                staged = Path(tmp, "wheels")
                pins = await asyncio.to_thread(
                    stage_job_packages, request, packages, self.config.package_index, staged,
                    arch=self.config.package_arch, max_bytes=self.config.max_package_bytes,
                    timeout=self.config.http_timeout_s,
                )  # fmt: skip
                commit = functools.partial(self._commit_wheels, repo, folder, staged)
                revision = await self._call("stage_packages", commit)
        mount = {"path": folder, "mount_path": WHEELS_MOUNT, "read_only": True}
        return pins, Volume(type="dataset", source=repo, revision=revision, **mount)

    def _package_repo(self) -> str:
        return self.config.package_repo or f"{self.config.namespace}/posttrain-packages"

    @staticmethod
    def _wheels_folder(key: str) -> str:
        return f"jobs/{label_value(key)}"

    def _commit_wheels(self, repo: str, folder: str, staged: Path) -> str:
        """`staged` as `folder` of the private `repo` (made on first use), replacing what an earlier
        attempt left there; the commit's id."""
        self._api.create_repo(repo, repo_type="dataset", private=True, exist_ok=True)
        if not self._api.repo_info(repo, repo_type="dataset").private:
            raise BackendError(
                f"the package repo {repo} is public: jobs' packages are staged only in a private repo "
                "(hfJobs.packageRepo)",
                transient=False,
            )
        info = self._api.upload_folder(
            repo_id=repo, repo_type="dataset", folder_path=staged, path_in_repo=folder,
            commit_message=f"wheels of {folder}", delete_patterns="*",
        )  # fmt: skip
        return str(info.oid)

    async def submit(self, request: JobRequest) -> Handle:
        packages = packages_to_stage(request, self.config.package_index, "hfJobs.packageIndex")
        pins, wheels = await self._stage_packages(request, packages) if packages else ([], None)
        labels = {
            KEY_LABEL: label_value(request.key),
            EPISODE_LABEL: label_value(f"{request.namespace}-{request.episode}"),
            MANAGED_LABEL: label_value(self.config.instance),
        }
        # The spec travels in the environment. `secrets` stays empty: jobs get no token of any kind.
        env = launcher_env(request)
        if wheels is not None:
            env |= install_env()
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
                volumes=[*self._volumes(request), *([wheels] if wheels else [])],
                namespace=self.config.namespace,
            ),
            retry=False,  # not idempotent: the caller finds by key before any retry
        )
        return Handle(info.id, request.outputs.prefix if request.outputs else "", packages=tuple(pins))

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
        """One list call for everything still active; one inspect per job that left that list. A list
        costs a request per page, so fewer jobs than the last list's pages (a cancel's check among
        thousands of running jobs) are inspected one by one instead."""
        if not handles:
            return {}
        wanted = {h.backend_job_id for h in handles}
        statuses = await self._list_active() if len(wanted) >= self._list_requests else {}
        return await self._inspect_rest(wanted, statuses)

    async def _list_active(self) -> dict[str, RemoteStatus]:
        sent_before = self.stats.http_requests
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
        self._list_requests = max(1, self.stats.http_requests - sent_before)
        return {info.id: status_of(info) for info in active}

    async def _inspect_rest(
        self, wanted: set[str], listed: dict[str, RemoteStatus]
    ) -> dict[str, RemoteStatus]:
        """`listed` plus an inspect of each wanted job it lacks. A transient failure leaves that job
        out (unknown this time, not lost), so one bad answer does not hide every other job's end;
        it is raised when nothing at all was learned, or when the backend refused outright. After a
        failure the rest are asked once each, without backoff: an outage costs a request a job."""
        statuses = {job_id: listed[job_id] for job_id in wanted & listed.keys()}
        failure: BackendError | None = None
        for job_id in wanted - listed.keys():
            try:
                statuses[job_id] = await self._inspect(job_id, retry=failure is None)
            except BackendError as exc:
                if not exc.transient:
                    raise
                failure = failure or exc
        if failure is not None and not statuses:
            raise failure
        return statuses

    async def _inspect(self, job_id: str, *, retry: bool = True) -> RemoteStatus:
        try:
            info = await self._call(
                "inspect_job",
                lambda: self._api.inspect_job(job_id=job_id, namespace=self.config.namespace),
                retry=retry,
            )
        except JobNotFoundError:
            return RemoteStatus(stage="lost", message=f"backend job {job_id} no longer exists")
        return status_of(info)

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
