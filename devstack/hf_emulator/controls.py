"""The emulator's test controls: faults injected into its API and its jobs (`faults.py`).

Reached as `emu.controls`, apart from the state the API serves: a test says what goes wrong,
the emulator's HTTP handlers and job runners act on it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from devstack.hf_emulator.faults import JOB_FAULTS, Fault, FaultBook
from devstack.hf_emulator.job_state import Job


def apply_job_fault(job: Job, fault: Fault) -> None:
    """Make `job` fail or vanish as `fault` says (a job fault, matched to it)."""
    if fault.kind == "job_error":
        # fail_after counts from the job's start: a job not started yet fails `seconds` into its run.
        elapsed = time.time() - job.started_at if job.started_at is not None else 0.0
        job.fail_after, job.fail_message = elapsed + fault.seconds, fault.message
    elif fault.kind == "job_vanish":
        job.vanish_at = time.time() + fault.seconds
    job.wake.set()


class EmulatorControls:
    def __init__(self, faults: FaultBook, cond: threading.Condition, jobs: dict[str, Job]) -> None:
        self._faults = faults
        self._cond = cond
        self._jobs = jobs  # the emulator's own table, read under `cond`

    def inject(self, kind: str, **kwargs: Any) -> Fault:
        """Add a fault, e.g. `inject("http_error", route=routes.CREATE_JOB, status=500, count=1)`."""
        return self.add_fault(Fault(kind=kind, **kwargs))

    def add_fault(self, fault: Fault) -> Fault:
        if fault.kind in JOB_FAULTS and fault.kind != "cancel_ignored":
            # Apply to matching existing jobs first; what is left of `count` waits for new jobs.
            with self._cond:
                for job in sorted(self._jobs.values(), key=lambda j: j.seq):
                    if fault.count == 0:
                        break
                    if job.terminal or job.vanished(time.time()):
                        continue
                    if fault.matches_job(job.id, job.spec.labels):
                        apply_job_fault(job, fault)
                        fault.hits += 1
                        if fault.count is not None:
                            fault.count -= 1
                self._cond.notify_all()
            if fault.count == 0:
                return fault
        return self._faults.add(fault)

    def clear_faults(self) -> None:
        self._faults.clear()

    def release_hangs(self) -> None:
        self._faults.release_hangs()

    def wait_held(self, route: str, count: int = 1, timeout: float = 60.0) -> None:
        """Until `count` requests of `route` (a `routes.*` key) are held by a `delay` or `hang` fault."""
        self._faults.wait_held(route, count, timeout)
