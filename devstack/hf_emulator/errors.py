"""The one exception endpoint code raises to answer with an error."""

from __future__ import annotations


class ApiError(Exception):
    """Answered as `{"error": message}` with `status` (and `headers`), as the Hub answers errors."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.headers = status, message, headers or {}
