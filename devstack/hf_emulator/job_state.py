"""A job's state as the emulator keeps it (and as the API shows it), apart from the runner that runs
it (`jobs.py`)."""

from __future__ import annotations

import math
import subprocess
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from devstack.hf_emulator.hardware import FLAVORS
from devstack.hf_emulator.validation import JobSpec
from devstack.sandbox.cgroups import JobCgroup

TERMINAL_STAGES = ("COMPLETED", "CANCELED", "ERROR", "DELETED")


def iso_z(ts: float) -> str:
    """The only timestamp format the client parses: `YYYY-MM-DDTHH:MM:SS.ffffffZ`."""
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


@dataclass
class LogLine:
    ts: float
    text: str

    def to_event(self) -> dict[str, str]:
        return {"data": self.text, "timestamp": iso_z(self.ts)}


@dataclass
class Job:
    id: str
    namespace: str
    owner_id: str
    spec: JobSpec
    seq: int
    created_at: float
    stage: str = "SCHEDULING"
    message: str | None = None
    started_at: float | None = None
    finished_at: float | None = None
    logs: list[LogLine] = field(default_factory=list)
    proc: subprocess.Popen[bytes] | None = None
    fail_after: float | None = None  # job_error fault: seconds after start
    fail_message: str = ""
    vanish_at: float | None = None  # job_vanish fault: absolute time
    exit_code: int | None = None
    wake: threading.Event = field(default_factory=threading.Event)
    # Set by cancel and by the emulator's shutdown: the runner ends the job and confirms it.
    end_requested: bool = False
    cgroup: JobCgroup | None = None

    @property
    def terminal(self) -> bool:
        return self.stage in TERMINAL_STAGES

    def vanished(self, now: float) -> bool:
        return self.vanish_at is not None and now >= self.vanish_at

    def billed_minutes(self, now: float) -> int:
        """Billing is per started minute of running time; a job that never started costs nothing."""
        if self.started_at is None:
            return 0
        running = (self.finished_at or now) - self.started_at
        return max(1, math.ceil(running / 60))

    def cost_micro_usd(self, now: float) -> int:
        return self.billed_minutes(now) * FLAVORS[self.spec.flavor].unit_cost_micro_usd

    def durations(self, now: float) -> dict[str, int]:
        end = self.finished_at or now
        scheduled = (self.started_at or end) - self.created_at
        running = end - self.started_at if self.started_at is not None else 0.0
        return {
            "schedulingSecs": int(scheduled),
            "runningSecs": int(running),
            "totalSecs": int(end - self.created_at),
        }

    def to_wire(self, now: float) -> dict[str, Any]:
        spec = self.spec
        owner = {"id": self.owner_id, "name": self.namespace, "type": "user"}
        data: dict[str, Any] = {
            "id": self.id,
            "createdAt": iso_z(self.created_at),
            "startedAt": iso_z(self.started_at) if self.started_at else None,
            "finishedAt": iso_z(self.finished_at) if self.finished_at else None,
            "command": spec.command,
            "arguments": spec.arguments,
            "environment": spec.environment,
            # The real API never returns secret values, only their names.
            "secrets": sorted(spec.secrets),
            "flavor": spec.flavor,
            "labels": spec.labels,
            "timeout": spec.timeout_seconds,
            "status": {"stage": self.stage, "message": self.message},
            "durations": self.durations(now),
            "owner": owner,
            "initiator": {"type": "user", "id": self.owner_id, "name": self.namespace},
            "type": "job",
        }
        if spec.docker_image is not None:
            data["dockerImage"] = spec.docker_image
        if spec.space_id is not None:
            data["spaceId"] = spec.space_id
        if spec.volumes:
            data["volumes"] = [v.to_wire() for v in spec.volumes]
        if spec.attempts is not None:
            data["retry"] = spec.attempts - 1
        data.update(spec.extra)
        return data


def request_end(job: Job) -> None:
    """Cancel or shutdown: the job's runner ends it (SIGTERM, then everything) and confirms it.
    Call with the emulator's condition held."""
    job.end_requested = True
    job.wake.set()
