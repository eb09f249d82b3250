"""What the pods soak saw each job pod do (a watch on every job pod, resumed through API server
restarts), and the bill of each: its container's start to its end at the flavor's price."""

import asyncio
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from kubernetes_asyncio import client, watch
from posttrain_operator.api.rules import parse_time
from posttrain_operator.backends.pods import names
from posttrain_operator.backends.pods.status import remote_status
from posttrain_operator.ledger import billed_seconds, cost_for

TERMINAL_PODS = {"Succeeded", "Failed"}
# The operator reads its clock, then reads the pod, then asks for its deletion: how far before the
# delete request its recorded end of a cancelled job may lie.
CANCEL_SLACK = timedelta(seconds=15)
UNSEEN = 10**12  # the high end of the bill of a pod whose end the watch missed

# -- what the pods did ------------------------------------------------------------------------------


@dataclass
class PodSeen:
    """One job pod (by UID) as the watch saw it."""

    namespace: str
    name: str
    key: str
    job: str
    episode: str  # "<namespace>/<episode>"
    started: datetime | None = None  # the job container's start
    ended: dict[str, Any] | None = None  # the first version in a terminal phase, not being deleted
    deleted_running: dict[str, Any] | None = None  # the first version being deleted before its end
    last: dict[str, Any] | None = None
    gone: bool = False
    unschedulable_since: float | None = None
    capacity_wait: float | None = None  # seconds Pending as Unschedulable, once scheduled


def container_end(pod: dict[str, Any] | None) -> datetime | None:
    return remote_status(pod).finished_at if pod else None


class PodWatch:
    def __init__(self, core: client.CoreV1Api, to_dict: Any, episodes: str) -> None:
        self.core = core
        self.episodes = episodes  # the prefix of the Episode annotation of the pods it records
        self.to_dict = to_dict
        self.pods: dict[str, PodSeen] = {}
        self.relists = 0
        self.missed = 0  # pods gone during a re-list gap: their end unseen

    def observe(self, pod: dict[str, Any], deleted: bool = False) -> None:
        meta = pod["metadata"]
        annotations, labels = meta.get("annotations") or {}, meta.get("labels") or {}
        if not annotations.get(names.EPISODE_ANNOTATION, "").startswith(self.episodes):
            return
        key, job = annotations.get(names.KEY_ANNOTATION, ""), labels.get(names.JOB_LABEL, "")
        episode = annotations.get(names.EPISODE_ANNOTATION, "")
        seen = self.pods.setdefault(meta["uid"], PodSeen(meta["namespace"], meta["name"], key, job, episode))
        status = pod.get("status") or {}
        phase = status.get("phase")
        remote = remote_status(pod)
        seen.started = seen.started or remote.started_at
        deleting = meta.get("deletionTimestamp") and phase not in TERMINAL_PODS
        if deleting and seen.ended is None and seen.deleted_running is None:
            seen.deleted_running = pod
        if phase in TERMINAL_PODS and seen.ended is None and seen.deleted_running is None:
            seen.ended = pod
        unschedulable = any(
            (c.get("type"), c.get("status"), c.get("reason")) == ("PodScheduled", "False", "Unschedulable")
            for c in status.get("conditions") or []
        )
        if unschedulable and seen.unschedulable_since is None:
            seen.unschedulable_since = time.monotonic()
        waited = seen.unschedulable_since is not None and seen.capacity_wait is None
        if pod["spec"].get("nodeName") and waited and seen.unschedulable_since is not None:
            seen.capacity_wait = time.monotonic() - seen.unschedulable_since
        seen.last = pod
        seen.gone = seen.gone or deleted

    async def relist(self) -> str:
        listed = self.to_dict(await self.core.list_pod_for_all_namespaces(label_selector=names.MANAGED_LABEL))
        present = set()
        for pod in listed["items"]:
            self.observe(pod)
            present.add(pod["metadata"]["uid"])
        for uid, seen in self.pods.items():
            if uid not in present and not seen.gone:
                seen.gone = True
                if seen.ended is None and seen.deleted_running is None:
                    self.missed += 1
        self.relists += 1
        version: str = listed["metadata"]["resourceVersion"]
        return version

    async def run(self) -> None:
        """Every version of every job pod; resumed from the last version seen through API server
        restarts, re-listed only when the API server no longer has it (410)."""
        version: str | None = None
        while True:
            try:
                if version is None:
                    version = await self.relist()
                async with watch.Watch().stream(
                    self.core.list_pod_for_all_namespaces, label_selector=names.MANAGED_LABEL,
                    resource_version=version, allow_watch_bookmarks=True, timeout_seconds=300,
                ) as stream:  # fmt: skip
                    async for event in stream:
                        raw = event["raw_object"]
                        if event["type"] == "ERROR":
                            version = None if raw.get("code") == 410 else version
                            break
                        version = raw["metadata"]["resourceVersion"]
                        if event["type"] != "BOOKMARK":
                            self.observe(raw, deleted=event["type"] == "DELETED")
            except asyncio.CancelledError:
                raise
            except client.ApiException as exc:
                if exc.status == 410:
                    version = None
                await asyncio.sleep(1)
            except Exception:
                await asyncio.sleep(1)


@dataclass(frozen=True)
class Bill:
    """What one pod ran, in micro-dollars: exact (`low == high`) or a range (a cancelled pod's)."""

    low: int
    high: int
    how: str
    full: int  # start to the container's real end, as far as the watch saw it


def bill_of(seen: PodSeen, price: int) -> Bill:
    def cost(end: datetime | None) -> int:
        return cost_for(price, billed_seconds(seen.started, end))

    if seen.started is None:
        return Bill(0, 0, "never started", 0)
    if seen.ended is not None:
        remote = remote_status(seen.ended)
        exact = cost_for(price, billed_seconds(remote.started_at, remote.finished_at))
        return Bill(exact, exact, "ran to its end", exact)
    if seen.deleted_running is not None:
        meta = seen.deleted_running["metadata"]
        deadline = parse_time(meta["deletionTimestamp"])
        assert deadline is not None
        request = deadline - timedelta(seconds=meta.get("deletionGracePeriodSeconds") or 0)
        end = container_end(seen.last) or deadline
        return Bill(cost(request - CANCEL_SLACK), cost(max(end, request)), "deleted while running", cost(end))
    return Bill(0, UNSEEN, "end unseen", 0)


# -- the soak ---------------------------------------------------------------------------------------
