"""A backend that is enabled but cannot work (its credentials are missing): every call fails with the
reason, so Episodes and jobs on it end visibly instead of the backend silently being off."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from posttrain_operator.backends.base import (
    ArtifactInfo,
    BackendError,
    CallStats,
    Handle,
    Health,
    JobRequest,
    RemoteStatus,
)


class UnavailableBackend:
    def __init__(self, name: str, health: Health) -> None:
        assert health.reason is not None
        self.name = name
        self.stats = CallStats()
        self.health = health

    def _refuse(self) -> NoReturn:
        raise BackendError(self.health.message, transient=False, reason=self.health.reason)

    async def check(self) -> Health:
        return self.health

    async def price(self, flavor: str) -> int:
        self._refuse()

    async def submit(self, request: JobRequest) -> Handle:
        self._refuse()

    async def find(self, key: str) -> Handle | None:
        self._refuse()

    async def status_many(self, handles: Sequence[Handle]) -> dict[str, RemoteStatus]:
        self._refuse()

    async def cancel(self, handle: Handle) -> bool:
        self._refuse()

    async def logs(self, handle: Handle, tail: int) -> list[str]:
        self._refuse()

    async def artifacts(self, output_prefix: str) -> list[ArtifactInfo]:
        self._refuse()

    async def read_artifact(self, output_prefix: str, path: str, max_bytes: int) -> bytes:
        self._refuse()
