"""A backend that is enabled but cannot work (its credentials are missing): every call fails with the
reason, so Episodes and jobs on it end visibly instead of the backend silently being off."""

from __future__ import annotations

from collections.abc import Sequence
from typing import NoReturn

from posttrain_operator.backends.base import BackendError, CallStats, Handle, Health, JobRequest


class UnavailableBackend:
    """Every call but `check` refuses: NoReturn, a subtype of every result, so the Backend protocol holds."""

    def __init__(self, name: str, health: Health) -> None:
        assert health.reason is not None
        self.name = name
        self.stats = CallStats()
        self.health = health

    def _refuse(self) -> NoReturn:
        raise BackendError(self.health.message, transient=False, reason=self.health.reason)

    async def check(self) -> Health:
        return self.health

    async def price(self, flavor: str) -> NoReturn:
        self._refuse()

    async def submit(self, request: JobRequest) -> NoReturn:
        self._refuse()

    async def find(self, key: str) -> NoReturn:
        self._refuse()

    async def status_many(self, handles: Sequence[Handle]) -> NoReturn:
        self._refuse()

    async def cancel(self, handle: Handle) -> NoReturn:
        self._refuse()

    async def logs(self, handle: Handle, tail: int) -> NoReturn:
        self._refuse()

    async def artifacts(self, output_prefix: str) -> NoReturn:
        self._refuse()

    async def read_artifact(self, output_prefix: str, path: str, max_bytes: int) -> NoReturn:
        self._refuse()
