"""In-memory stand-ins for the reconciler unit tier: a Kubernetes API that keeps resourceVersions and
answers 409 on a stale compare-and-swap, a backend that runs nothing, and a clock that moves only when
told. The integration suite proves the same paths against the real API server and the HF emulator."""

from __future__ import annotations

import copy
import itertools
import uuid
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

from kubernetes_asyncio.client.exceptions import ApiException
from posttrain_operator.backends.base import (
    TERMINAL_STAGES,
    ArtifactInfo,
    BackendError,
    CallStats,
    Handle,
    JobRequest,
    PackagePin,
    RemoteStatus,
    UnknownFlavor,
)

Obj = dict[str, Any]
START = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


class FakeClock:
    def __init__(self, now: datetime = START) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def _merge(target: Obj, patch: Obj) -> Obj:
    """RFC 7386 merge patch: objects merge, null deletes, anything else replaces."""
    out = dict(target)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict):
            out[key] = _merge(out[key] if isinstance(out.get(key), dict) else {}, value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _matches(obj: Obj, field_selector: str | None, label_selector: str | None) -> bool:
    for selector, read in (
        (field_selector, lambda path: _path(obj, path)),
        (label_selector, lambda key: (obj["metadata"].get("labels") or {}).get(key)),
    ):
        for term in filter(None, (selector or "").split(",")):
            key, _, want = term.partition("=")
            if read(key) != want:
                return False
    return True


def _path(obj: Obj, dotted: str) -> Any:
    value: Any = obj
    for part in dotted.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def _episode_rules(stored: Obj, spec_patch: Obj) -> None:
    """The Episode CRD's submission rules (api/crds.py), on the object as stored: set once, and only
    while the Episode is Running."""
    old = stored["spec"].get("submission")
    new = spec_patch.get("submission", old)
    if old is not None and new != old:
        raise ApiException(422, "spec.submission is set once and is then immutable")
    if old is None and new is not None and (stored.get("status") or {}).get("phase") != "Running":
        raise ApiException(422, "spec.submission can be set only while the Episode is Running")


class FakeKubernetes:
    """The slice of CustomObjectsApi, CoreV1Api and AuthenticationV1Api the operator calls, over one
    in-memory store. Every call is counted by method; `conflicts[method] = n` makes the next n calls of
    a write method fail with 409, as if another writer had got there first."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], Obj] = {}
        self.calls: Counter[str] = Counter()
        self.conflicts: Counter[str] = Counter()
        self.events: list[Obj] = []
        self._versions = itertools.count(1)

    # --- helpers for tests ---------------------------------------------------------------------

    def put(self, plural: str, namespace: str, body: Obj) -> Obj:
        """Store an object as if a user had created it (not counted as an operator call)."""
        return self._create(plural, namespace, body)

    def obj(self, plural: str, namespace: str, name: str) -> Obj:
        return copy.deepcopy(self.objects[(plural, namespace, name)])

    def writes(self) -> int:
        return sum(n for m, n in self.calls.items() if not m.startswith(("get_", "list_", "read_")))

    def reset_calls(self) -> None:
        self.calls.clear()

    # --- the store -----------------------------------------------------------------------------

    def _bump(self, obj: Obj) -> None:
        obj["metadata"]["resourceVersion"] = str(next(self._versions))

    def _create(self, plural: str, namespace: str, body: Obj) -> Obj:
        name = body["metadata"]["name"]
        if (plural, namespace, name) in self.objects:
            raise ApiException(409, "AlreadyExists")
        obj = copy.deepcopy(body)
        obj["metadata"].update(namespace=namespace, uid=str(uuid.uuid4()), generation=1)
        obj["metadata"].setdefault("creationTimestamp", START.strftime("%Y-%m-%dT%H:%M:%SZ"))
        self._bump(obj)
        self.objects[(plural, namespace, name)] = obj
        return copy.deepcopy(obj)

    def _existing(self, plural: str, namespace: str, name: str) -> Obj:
        try:
            return self.objects[(plural, namespace, name)]
        except KeyError:
            raise ApiException(404, "NotFound") from None

    def _maybe_conflict(self, method: str) -> None:
        if self.conflicts[method] > 0:
            self.conflicts[method] -= 1
            raise ApiException(409, "Conflict")

    def _check_version(self, obj: Obj, body: Obj) -> None:
        wanted = (body.get("metadata") or {}).get("resourceVersion")
        if wanted is not None and wanted != obj["metadata"]["resourceVersion"]:
            raise ApiException(409, "Conflict")

    # --- CustomObjectsApi ----------------------------------------------------------------------

    async def get_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **_: Any
    ) -> Obj:
        self.calls["get_namespaced_custom_object"] += 1
        return copy.deepcopy(self._existing(plural, namespace, name))

    async def list_namespaced_custom_object(
        self,
        group: str,
        version: str,
        namespace: str,
        plural: str,
        field_selector: str | None = None,
        label_selector: str | None = None,
        **_: Any,
    ) -> Obj:
        self.calls["list_namespaced_custom_object"] += 1
        items = [
            copy.deepcopy(o)
            for (p, ns, _name), o in sorted(self.objects.items())
            if p == plural and ns == namespace and _matches(o, field_selector, label_selector)
        ]
        return {"items": items, "metadata": {"resourceVersion": str(next(self._versions))}}

    async def create_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, body: Obj, **_: Any
    ) -> Obj:
        self.calls["create_namespaced_custom_object"] += 1
        return self._create(plural, namespace, body)

    async def replace_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Obj, **_: Any
    ) -> Obj:
        self.calls["replace_namespaced_custom_object_status"] += 1
        self._maybe_conflict("replace_namespaced_custom_object_status")
        obj = self._existing(plural, namespace, name)
        if (body.get("metadata") or {}).get("resourceVersion") is None:
            raise ApiException(422, "a replace needs metadata.resourceVersion")
        self._check_version(obj, body)
        obj["status"] = copy.deepcopy(body.get("status") or {})
        self._bump(obj)
        return copy.deepcopy(obj)

    async def patch_namespaced_custom_object_status(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Any, **_: Any
    ) -> Obj:
        self.calls["patch_namespaced_custom_object_status"] += 1
        self._maybe_conflict("patch_namespaced_custom_object_status")
        obj = self._existing(plural, namespace, name)
        if isinstance(body, list):  # a JSON patch: test and replace under /status
            for op in body:
                key = op["path"].removeprefix("/status/")
                if op["op"] == "test" and (obj.get("status") or {}).get(key) != op["value"]:
                    raise ApiException(422, "test failed")
                if op["op"] == "replace":
                    obj.setdefault("status", {})[key] = op["value"]
        else:
            self._check_version(obj, body)
            obj["status"] = _merge(obj.get("status") or {}, body.get("status") or {})
        self._bump(obj)
        return copy.deepcopy(obj)

    async def patch_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, body: Obj, **_: Any
    ) -> Obj:
        self.calls["patch_namespaced_custom_object"] += 1
        self._maybe_conflict("patch_namespaced_custom_object")
        obj = self._existing(plural, namespace, name)
        self._check_version(obj, body)
        if plural == "episodes":
            _episode_rules(obj, body.get("spec") or {})
        if "spec" in body:
            obj["spec"] = _merge(obj.get("spec") or {}, body["spec"])
            obj["metadata"]["generation"] += 1
        meta = {k: v for k, v in (body.get("metadata") or {}).items() if k != "resourceVersion"}
        obj["metadata"] = _merge(obj["metadata"], meta)
        self._bump(obj)
        return copy.deepcopy(obj)

    async def delete_namespaced_custom_object(
        self, group: str, version: str, namespace: str, plural: str, name: str, **_: Any
    ) -> Obj:
        self.calls["delete_namespaced_custom_object"] += 1
        obj = self._existing(plural, namespace, name)
        if obj["metadata"].get("finalizers"):
            obj["metadata"]["deletionTimestamp"] = START.strftime("%Y-%m-%dT%H:%M:%SZ")
            self._bump(obj)
        else:
            del self.objects[(plural, namespace, name)]
        return {"status": "Success"}

    # --- CoreV1Api -----------------------------------------------------------------------------

    async def create_namespaced_secret(self, namespace: str, body: Obj, **_: Any) -> Obj:
        self.calls["create_namespaced_secret"] += 1
        return self._create("secrets", namespace, body)

    async def read_namespaced_secret(self, name: str, namespace: str, **_: Any) -> Any:
        self.calls["read_namespaced_secret"] += 1
        return SimpleNamespace(data=copy.deepcopy(self._existing("secrets", namespace, name).get("data")))

    async def create_namespaced_event(self, namespace: str, body: Obj, **_: Any) -> Obj:
        self.calls["create_namespaced_event"] += 1
        self.events.append(copy.deepcopy(body))
        return body


@dataclass
class FakeJob:
    request: JobRequest
    status: RemoteStatus = field(default_factory=lambda: RemoteStatus("pending", raw_stage="SCHEDULING"))


class FakeBackend:
    """A backend that runs nothing: tests move its jobs through stages with `set_stage`."""

    name = "hf-jobs"

    def __init__(self, prices: dict[str, int] | None = None) -> None:
        self.prices = prices if prices is not None else {"cpu-basic": 167, "cpu-upgrade": 500}
        self.stats = CallStats()
        self.jobs: dict[str, FakeJob] = {}
        self.artifact_files: dict[str, dict[str, bytes]] = {}
        self.confirm_cancel = True
        self.fail_submit: BackendError | None = None
        self.resolved: tuple[PackagePin, ...] = ()  # what a resolving backend staged for a job
        self.fail_price: BackendError | None = None
        self.page_size = 50  # jobs per list request, as HF Jobs pages them
        self.unread: set[str] = set()  # jobs whose status a pass fails to read (a failed inspect)
        self.requests: list[JobRequest] = []
        self._ids = itertools.count(1)

    async def price(self, flavor: str) -> int:
        self.stats.count("price")
        if self.fail_price is not None:
            raise self.fail_price
        if flavor not in self.prices:
            raise UnknownFlavor(flavor, list(self.prices))
        return self.prices[flavor]

    async def submit(self, request: JobRequest) -> Handle:
        self.stats.count("submit")
        self.requests.append(request)  # sent, whatever the answer: a timed-out one may land later
        if self.fail_submit is not None:
            raise self.fail_submit
        job_id = f"job-{next(self._ids)}"
        self.jobs[job_id] = FakeJob(request)
        return Handle(job_id, request.outputs.prefix if request.outputs else "", packages=self.resolved)

    async def find(self, key: str) -> Handle | None:
        self.stats.count("find")
        for job_id, job in self.jobs.items():
            if job.request.key == key:
                return Handle(job_id, job.request.outputs.prefix if job.request.outputs else "")
        return None

    async def status_many(self, handles: Sequence[Handle]) -> dict[str, RemoteStatus]:
        self.stats.count("status_many")
        for _page in range(max(1, -(-len(handles) // self.page_size))):
            self.stats.sent()
        known = [h.backend_job_id for h in handles if h.backend_job_id in self.jobs]
        return {job_id: self.jobs[job_id].status for job_id in known if job_id not in self.unread}

    async def cancel(self, handle: Handle) -> bool:
        self.stats.count("cancel")
        job = self.jobs.get(handle.backend_job_id)
        if job is None or job.status.stage in TERMINAL_STAGES:
            return True
        if not self.confirm_cancel:
            return False
        job.status = RemoteStatus("cancelled", "", job.status.started_at, job.status.started_at, "CANCELED")
        return True

    async def logs(self, handle: Handle, tail: int) -> list[str]:
        return []

    async def artifacts(self, output_prefix: str) -> list[ArtifactInfo]:
        self.stats.count("artifacts")
        files = self.artifact_files.get(output_prefix, {})
        return [ArtifactInfo(path, len(data)) for path, data in sorted(files.items())]

    async def read_artifact(self, output_prefix: str, path: str, max_bytes: int) -> bytes:
        self.stats.count("read_artifact")
        try:
            return self.artifact_files[output_prefix][path][:max_bytes]
        except KeyError:
            raise FileNotFoundError(path) from None

    # --- for tests -----------------------------------------------------------------------------

    def set_stage(self, job_id: str, status: RemoteStatus) -> None:
        self.jobs[job_id].status = status

    def only_job(self) -> str:
        (job_id,) = self.jobs
        return job_id
