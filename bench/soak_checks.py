"""What the chaos soaks (`chaos_soak.py` on HF Jobs, `pods_soak.py` on the pods backend) do and check
from outside, shared: creates and Episode endings retried through API server restarts, the watch of
every Episode version with its `reserved + settled <= budget` check, and the per-Episode checks made
once everything has settled (open Episodes and jobs, orphans without a reason, what a job's status
says when its books differ from the bill)."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from typing import Any

import aiohttp
from admissions import GROUP, VERSION
from kubernetes_asyncio import client, watch
from posttrain_operator.api.models import TERMINAL_JOB_PHASES

ENDED = {"Succeeded", "Failed", "Completed"}  # an Episode's terminal phases
# What a request meets while the API server restarts.
UNREACHABLE = (TimeoutError, OSError, aiohttp.ClientError)


def refused(exc: client.ApiException) -> bool:
    """An answer not worth retrying: refused, or there already (not a 5xx or a 429)."""
    return bool(exc.status < 500 and exc.status != 429)


class EpisodeBooks:
    """Episodes and AgentJobs of one namespace (those named with `prefix`) as a soak's client makes
    and ends them, and every Episode version its watch delivers checked for `reserved + settled <=
    budget`."""

    def __init__(self, custom: client.CustomObjectsApi, namespace: str, prefix: str = "") -> None:
        self.custom = custom
        self.namespace = namespace
        self.prefix = prefix
        self.versions = 0
        self.violations: list[str] = []

    async def create(self, plural: str, body: dict[str, Any]) -> dict[str, Any] | None:
        """Create, retried through API server restarts; None if it exists already (an earlier try
        that went through) or was refused (an Episode that ended meanwhile)."""
        while True:
            try:
                created: dict[str, Any] = await self.custom.create_namespaced_custom_object(
                    GROUP, VERSION, self.namespace, plural, body
                )
                return created
            except client.ApiException as exc:
                if refused(exc):
                    return None
            except UNREACHABLE:
                pass
            await asyncio.sleep(1)

    async def list(self, plural: str) -> list[dict[str, Any]]:
        listed = await self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace, plural)
        return [item for item in listed["items"] if item["metadata"]["name"].startswith(self.prefix)]

    async def end_early(self, how: str, name: str) -> bool:
        """Delete the Episode, or submit its first Succeeded job as its checkpoint (one with none yet
        ends at its limit instead); True once the API server took it."""
        while True:
            try:
                if how == "delete":
                    await self.custom.delete_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                      "episodes", name)  # fmt: skip
                else:
                    done = [j for j in await self.list("agentjobs") if j["spec"]["episode"] == name
                            and j.get("status", {}).get("phase") == "Succeeded"]  # fmt: skip
                    if not done:
                        return False
                    patch = {"spec": {"submission": {"checkpointFrom": done[0]["metadata"]["name"]}}}
                    await self.custom.patch_namespaced_custom_object(
                        GROUP, VERSION, self.namespace, "episodes", name, patch,
                        _content_type="application/merge-patch+json",
                    )  # fmt: skip
                return True
            except client.ApiException as exc:
                if refused(exc):  # gone, or no longer Running
                    return False
            except UNREACHABLE:
                pass
            await asyncio.sleep(1)

    def observe(self, episode: dict[str, Any]) -> None:
        ledger = (episode.get("status") or {}).get("ledger") or {}
        if not ledger or not episode["metadata"]["name"].startswith(self.prefix):
            return
        self.versions += 1
        if ledger["reservedMicroUSD"] + ledger["settledMicroUSD"] > ledger["budgetMicroUSD"]:
            meta = episode["metadata"]
            self.violations.append(f"episode {meta['name']} version {meta['resourceVersion']}: {ledger}")

    async def watch_episodes(self) -> None:
        """Every Episode version, through broken watches and API server restarts (re-list, re-watch)."""
        while True:
            try:
                listed = await self.custom.list_namespaced_custom_object(GROUP, VERSION, self.namespace,
                                                                         "episodes")  # fmt: skip
                for item in listed["items"]:
                    self.observe(item)
                async with watch.Watch().stream(
                    self.custom.list_namespaced_custom_object, GROUP, VERSION, self.namespace, "episodes",
                    resource_version=listed["metadata"]["resourceVersion"], timeout_seconds=300,
                ) as stream:  # fmt: skip
                    async for event in stream:
                        if event["type"] in ("ADDED", "MODIFIED"):
                            self.observe(event["object"])
            except asyncio.CancelledError:
                raise
            except Exception:
                await asyncio.sleep(1)


def still_open(
    episodes: list[dict[str, Any]], jobs: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The Episodes not yet ended with nothing reserved, and the jobs not yet terminal."""
    open_episodes = [e for e in episodes if (e.get("status") or {}).get("phase") not in ENDED
                     or e["status"]["ledger"]["reservedMicroUSD"]]  # fmt: skip
    open_jobs = [j for j in jobs if (j.get("status") or {}).get("phase") not in TERMINAL_JOB_PHASES]
    return open_episodes, open_jobs


def untyped_orphans(episode: dict[str, Any]) -> list[str]:
    """The violation an Episode's orphans without a reason make (none: an empty list)."""
    untyped = [o for o in (episode.get("status") or {}).get("orphanedJobs") or [] if not o.get("reason")]
    return [f"episode {episode['metadata']['name']}: orphans without a reason: {untyped}"] if untyped else []


def job_seen(job: dict[str, Any]) -> dict[str, Any]:
    """What a job's status says about its run and its settlement: printed behind a mismatch."""
    status = job.get("status") or {}
    fields = ("phase", "reason", "billedSeconds", "settledMicroUSD", "startedAt", "finishedAt",
              "backendStage", "backendJobId")  # fmt: skip
    return {k: status.get(k) for k in fields}


async def steady_load(
    books: EpisodeBooks, live: list[dict[str, Any]], rng: random.Random, jobs: int, seconds: float,
    job_body: Callable[[int, dict[str, Any]], dict[str, Any]],
) -> int:  # fmt: skip
    """`jobs` AgentJobs at a steady rate over `seconds`, each into a live Episode drawn from `rng`, as
    the gateway makes them (`job_body(n, episode)`); how many the API server took."""
    gap = seconds / jobs
    pending: set[asyncio.Task[dict[str, Any] | None]] = set()
    started = time.monotonic()
    for n in range(jobs):
        await asyncio.sleep(max(0.0, started + n * gap - time.monotonic()))
        if not live:
            break
        body = job_body(n, rng.choice(live))
        pending.add(asyncio.create_task(books.create("agentjobs", body)))
    return sum(created is not None for created in await asyncio.gather(*pending))
