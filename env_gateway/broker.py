"""Client of the operator's internal broker API (logs and artifacts need the backend credential,
which only the operator holds). Authenticates with the gateway's ServiceAccount token."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import BaseModel


class BrokerError(Exception):
    pass


class _Logs(BaseModel):
    lines: list[str]
    truncated: bool


class BrokerClient:
    def __init__(self, base_url: str, token_file: str, timeout: float = 10.0) -> None:
        self._token_file = Path(token_file)
        self._http = httpx.AsyncClient(base_url=base_url.rstrip("/"), timeout=timeout)

    async def close(self) -> None:
        await self._http.aclose()

    def _token(self) -> str:
        # Re-read each time: projected ServiceAccount tokens rotate on disk.
        try:
            return self._token_file.read_text().strip()
        except OSError as exc:
            raise BrokerError(f"the gateway has no ServiceAccount token: {exc.strerror}") from exc

    async def logs(self, namespace: str, job: str, tail: int) -> tuple[list[str], bool]:
        try:
            response = await self._http.get(
                f"/v1/namespaces/{namespace}/agentjobs/{job}/logs",
                params={"tail": tail},
                headers={"Authorization": f"Bearer {self._token()}"},
            )
        except httpx.HTTPError as exc:
            raise BrokerError(f"the log broker is unreachable: {type(exc).__name__}") from exc
        if response.status_code != 200:
            raise BrokerError(f"the log broker answered {response.status_code}: {response.text[:200]}")
        logs = _Logs.model_validate_json(response.content)
        return logs.lines, logs.truncated
