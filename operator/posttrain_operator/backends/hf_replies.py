"""What HF Jobs' replies and errors mean: stages, exit codes, retryable failures, rate-limit waits and
label values. Pure: read from the client's objects, never a call."""

from __future__ import annotations

import re
from datetime import datetime

import httpx2
from huggingface_hub import JobInfo
from huggingface_hub.errors import HfHubHTTPError

from posttrain_operator.backends.base import RemoteStage, RemoteStatus

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


def retry_after(exc: Exception) -> float | None:
    response = getattr(exc, "response", None)
    if response is None:
        return None
    header = response.headers.get("RateLimit") or ""
    if match := _RATE_LIMIT_RESET.search(header):
        return float(match.group(1))
    retry_after = response.headers.get("Retry-After")
    return float(retry_after) if retry_after and retry_after.isdigit() else None


def credentials_rejected(exc: Exception) -> bool:
    response = exc.response if isinstance(exc, HfHubHTTPError) else None
    return response is not None and response.status_code in (401, 403)


def is_transient(exc: Exception) -> bool:
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


def status_of(info: JobInfo) -> RemoteStatus:
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
