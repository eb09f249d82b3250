"""The two Server-Sent-Event streams of a job, its logs and its metrics (`docs/hf-jobs-api.md`)."""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Protocol

from devstack.hf_emulator import records
from devstack.hf_emulator.errors import ApiError

if TYPE_CHECKING:
    from devstack.hf_emulator.surface import Emulator


class SseWriter(Protocol):
    """What of the request handler (`http_api`) a stream writes through."""

    def start_sse(self) -> None: ...

    def chunk(self, data: bytes) -> None: ...

    def end_chunks(self) -> None: ...


def stream_logs(
    h: SseWriter, emu: Emulator, namespace: str, job_id: str, query: dict[str, list[str]]
) -> None:
    with emu.cond:
        job = emu.visible_job(namespace, job_id)
        idx = 0
        if query.get("tail"):
            try:
                tail = int(query["tail"][0])
            except ValueError as exc:
                raise ApiError(400, "tail must be an integer") from exc
            idx = max(0, len(job.logs) - max(0, tail))
    h.start_sse()
    # Every connection replays the log from its start: the client deduplicates by event index.
    while True:
        keepalive_at = time.monotonic() + emu.keepalive_seconds
        with emu.cond:
            while not (emu.stopping or len(job.logs) > idx or job.terminal or job.vanished(time.time())):
                remaining = keepalive_at - time.monotonic()
                if remaining <= 0:
                    break
                emu.cond.wait(remaining)
            batch = job.logs[idx:]
            idx += len(batch)
            finished = emu.stopping or job.terminal or job.vanished(time.time())
        if batch:
            h.chunk(b"".join(b"data: %s\n\n" % json.dumps(line.to_event()).encode() for line in batch))
        elif not finished:
            h.chunk(b": keep-alive\n\n")
        if finished:
            break
    h.end_chunks()


def stream_metrics(h: SseWriter, emu: Emulator, namespace: str, job_id: str) -> None:
    with emu.cond:
        job = emu.visible_job(namespace, job_id)
        if job.terminal:
            raise ApiError(406, "Job is not running")
    h.start_sse()
    prev: tuple[float, float] | None = None
    while True:
        with emu.cond:
            finished = emu.stopping or job.terminal or job.vanished(time.time())
            running = job.stage == "RUNNING"
        if finished:
            break
        if running:
            sample, prev = records.metrics_sample(job, prev)
            h.chunk(b"event: metric\ndata: %s\n\n" % json.dumps(sample).encode())
        with emu.cond:
            emu.cond.wait(emu.metrics_interval)
    h.end_chunks()
