"""What the HTTP side (`http_api.py`, `hub_api.py`, `streams.py`) reaches of the emulator.

`HfEmulator` (`emulator.py`) is one; the handlers name this instead, so that the emulator, which
starts the server, and the handlers it serves with do not import each other.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any, Protocol

from devstack.hf_emulator.controls import EmulatorControls
from devstack.hf_emulator.faults import FaultBook
from devstack.hf_emulator.hub_repos import HubRepos
from devstack.hf_emulator.job_state import Job
from devstack.hf_emulator.records import BillingRecord, RecordedRequest
from devstack.hf_emulator.repos import RepoStore


class Emulator(Protocol):
    token: str
    namespace: str
    orgs: tuple[str, ...]
    owner_id: str
    tree_page_size: int
    keepalive_seconds: float
    metrics_interval: float
    max_commit_bytes: int
    repos: RepoStore
    hub: HubRepos
    faults: FaultBook
    controls: EmulatorControls
    cond: threading.Condition
    stopping: bool

    def record_request(
        self, method: str, path: str, route: str, headers: list[tuple[str, str]], body: bytes
    ) -> None: ...

    def request_counts(self) -> dict[str, int]: ...

    def requests(self) -> list[RecordedRequest]: ...

    def all_creations(self) -> dict[str, dict[str, int]]: ...

    def reset_stats(self) -> None: ...

    def jobs(self) -> list[dict[str, Any]]: ...

    def billing(self) -> list[BillingRecord]: ...

    def bucket_path(self, bucket_id: str) -> Path: ...

    def create_bucket(self, bucket_id: str) -> Path: ...

    def visible_job(self, namespace: str, job_id: str) -> Job: ...

    def create_job(self, namespace: str, body: object) -> dict[str, Any]: ...

    def cancel_job(self, namespace: str, job_id: str) -> dict[str, Any]: ...

    def list_jobs(
        self, namespace: str, query: dict[str, list[str]], cursor: int | None
    ) -> tuple[list[dict[str, Any]], int | None]: ...

    def count_jobs(self, namespace: str, query: dict[str, list[str]]) -> int: ...
