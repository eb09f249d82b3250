"""The one exception endpoint code raises to answer with an error."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """Answered as `{"error": message, **extra}` with `status` (and `headers`), as the Hub answers
    errors (some carry more: a 409 on repo creation names the repo's `url`)."""

    def __init__(
        self,
        status: int,
        message: str,
        headers: dict[str, str] | None = None,
        extra: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}
        self.extra = extra or {}
