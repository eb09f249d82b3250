"""Client of the operator's internal broker API (logs and artifacts need the backend credential,
which only the operator holds). Authenticates with the gateway's ServiceAccount token."""

from __future__ import annotations

from pathlib import Path

import httpx
from pydantic import BaseModel


class BrokerError(Exception):
    """The broker could not answer (unreachable, or a failure of its own or of the backend)."""


class BrokerRefused(BrokerError):
    """The broker answered that the request cannot be served as asked: `status` and its reason."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class Artifact(BaseModel):
    path: str
    size: int
    text: str


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

    async def _get(self, namespace: str, job: str, what: str, params: dict[str, str | int]) -> bytes:
        try:
            response = await self._http.get(
                f"/v1/namespaces/{namespace}/agentjobs/{job}/{what}",
                params=params,
                headers={"Authorization": f"Bearer {self._token()}"},
            )
        except httpx.HTTPError as exc:
            raise BrokerError(f"the log broker is unreachable: {type(exc).__name__}") from exc
        if response.status_code in (400, 404, 422):
            try:
                message = str(response.json()["error"])
            except (ValueError, KeyError, TypeError):
                message = response.text[:200]
            raise BrokerRefused(response.status_code, message)
        if response.status_code != 200:
            raise BrokerError(f"the log broker answered {response.status_code}: {response.text[:200]}")
        return response.content

    async def logs(self, namespace: str, job: str, tail: int) -> tuple[list[str], bool]:
        logs = _Logs.model_validate_json(await self._get(namespace, job, "logs", {"tail": tail}))
        return logs.lines, logs.truncated

    async def read_artifact(self, namespace: str, job: str, path: str) -> Artifact:
        return Artifact.model_validate_json(await self._get(namespace, job, "artifact", {"path": path}))
