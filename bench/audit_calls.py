"""Kubernetes API calls per admission, read from the API server's audit log: every request the
operator (its reconcilers and kopf) makes about a new job and its Episode, from the job's creation
until it is Running, for jobs created one at a time."""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from admissions import BENCH_AGENT, GROUP, VERSION, create_episode, job_body, reach
from kubernetes_asyncio import client

NOT_OPERATOR = (BENCH_AGENT, "kube-", "kubectl/")  # the control plane's own, and kubectl's


async def admit_one_at_a_time(api: client.ApiClient, namespace: str, episodes: int, jobs: int) -> list[Any]:
    """Create jobs one at a time, each once the previous one is Running and the operator is quiet;
    returns (job, episode, created, running) windows for `calls_per_admission`."""
    custom = client.CustomObjectsApi(api)
    for e in range(episodes):
        await create_episode(custom, namespace, f"calls{e}", jobs)
    started = [await reach(custom, namespace, "episodes", f"calls{e}", "Running") for e in range(episodes)]
    await asyncio.sleep(2)  # the episodes' own start-up calls are over
    windows = []
    for e, episode in enumerate(started):
        for j in range(jobs):
            name = f"calls{e}-j{j}"
            body = job_body(name, episode)
            created = datetime.now(UTC)
            await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", body)
            await reach(custom, namespace, "agentjobs", name, "Running")
            running = datetime.now(UTC)
            await asyncio.sleep(1.0)  # kopf's own bookkeeping after the handler, and the events
            windows.append((name, f"calls{e}", created, running))
    return windows


@dataclass
class Admissions:
    """What the audit log says about jobs admitted one at a time."""

    per_job: float  # requests the operator made per admission
    by_call: Counter[str]  # the total by agent, verb and resource
    milestones: dict[str, list[float]]  # seconds from the create to each step, per job


def calls_per_admission(audit_log: Path, namespace: str, windows: list[Any]) -> Admissions:
    """Requests the operator made about each job (and its Episode, and Events) while it was admitted:
    from its creation to one second after it was seen Running. Status writes to the job after it was
    Running are the poller's and are left out. Also when, after the create, kopf made its first patch
    (its finalizer on a bare job; its progress after the handler on one born with it), the reconciler
    made its first call, and the job's first status write (Admitted) arrived."""
    entries = []
    # The API server rotates its audit log (audit-<time>.log beside it): read the rotated ones too.
    for path in sorted(audit_log.parent.glob("audit*.log")):
        with path.open() as log:
            for line in log:
                entry = json.loads(line)
                ref, agent = entry.get("objectRef") or {}, entry.get("userAgent", "")
                if ref.get("namespace") == namespace and not agent.startswith(NOT_OPERATOR):
                    entries.append(entry)
    by_call: Counter[str] = Counter()
    milestones: dict[str, list[float]] = {"kopf's first patch": [], "reconciler": [], "Admitted": []}
    for job, episode, created, running in windows:
        seen: dict[str, float] = {}
        for entry in entries:
            ref = entry["objectRef"]
            at = datetime.fromisoformat(entry["requestReceivedTimestamp"].replace("Z", "+00:00"))
            if not created <= at <= running + timedelta(seconds=1):
                continue
            resource = ref.get("resource", "") + (f"/{ref['subresource']}" if ref.get("subresource") else "")
            named = ref.get("name")
            ours = (
                (ref.get("resource") == "agentjobs" and named == job)
                or (ref.get("resource") == "episodes" and named == episode)
                or ref.get("resource") == "events"
                or ref.get("resource") == "budgetquotas"  # read (or not found) and reserved on
            )
            if not ours or (resource == "agentjobs/status" and at > running):
                continue
            agent = "kopf" if entry["userAgent"].startswith("kopf/") else "operator"
            by_call[f"{agent} {entry['verb']} {resource}"] += 1
            after = (at - created).total_seconds()
            step = {"kopf": "kopf's first patch", "operator": "reconciler"}[agent]
            seen[step] = min(seen.get(step, after), after)
            if agent == "operator" and resource == "agentjobs/status":
                seen["Admitted"] = min(seen.get("Admitted", after), after)
        for step, after in seen.items():
            milestones[step].append(after)
    return Admissions(sum(by_call.values()) / len(windows), by_call, milestones)
