"""Rules about an Episode that the operator and the gateway must read the same way: the limits in
force, what is left of the budget, steps and wall time, how many jobs run, when it has ended, how a
token is hashed, the label that ties objects to it, and how times are written.

Pure functions of the typed models and an injected `now`; no I/O. The task's defaults come in through
`TaskDefaults`, which the registry's `Task` satisfies, so this package needs nothing from it.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Protocol

from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus, Integrity, Ledger
from posttrain_operator.api.models import (
    API_VERSION,
    MAX_LINEAGE,
    AgentJobSpec,
    AgentJobStatus,
    IntegrityFinding,
    status_of,
)
from posttrain_operator.api.models import EPISODE_LABEL as EPISODE_LABEL
from posttrain_operator.api.money import usd_to_micro

ENDED_PHASES: frozenset[str] = frozenset({"Completed", "Failed"})
# The operator's finalizer, on both kinds: nothing is deleted before its backend job is confirmed gone.
FINALIZER = "posttrain.dev/finalizer"
# On the Episodes and AgentJobs the gateway creates for an agent.
CREATED_BY_LABEL = "posttrain.dev/created-by"
CREATED_BY_GATEWAY = "env-gateway"


def score_job_name(episode: str) -> str:
    """The AgentJob (purpose score) the operator creates to score an Episode's submission."""
    return f"{episode}-score"


def episode_owner(
    episode: Mapping[str, Any], *, controller: bool = False, blocking: bool = False
) -> dict[str, Any]:
    """An ownerReference to `episode` (its body): deleting the Episode garbage-collects the object,
    and a job goes only after the operator's finalizer has cancelled it. `blocking` sets
    blockOwnerDeletion, which a cluster enforcing owner-reference permissions grants only to who may
    update the Episode's finalizers: the operator may, the gateway may not (nor needs to: the
    Episode's own finalizer waits for its jobs)."""
    meta = episode["metadata"]
    owner = {"apiVersion": API_VERSION, "kind": "Episode", "name": meta["name"], "uid": meta["uid"]}
    return (
        owner
        | ({"controller": True} if controller else {})
        | ({"blockOwnerDeletion": True} if blocking else {})
    )


def new_job_metadata(
    name: str,
    episode: Mapping[str, Any],
    labels: Mapping[str, str] | None = None,
    *,
    controller: bool = False,
    blocking: bool = False,
) -> dict[str, Any]:
    """The metadata of a new AgentJob of `episode`: labelled with and owned by it, and holding the
    operator's finalizer from the start. A job born so is admitted in the operator's first pass; one
    born bare first costs kopf a write and a watch event to add its finalizer, and the operator a patch
    to adopt it."""
    return {
        "name": name,
        "labels": {**(labels or {}), EPISODE_LABEL: episode["metadata"]["name"]},
        "ownerReferences": [episode_owner(episode, controller=controller, blocking=blocking)],
        "finalizers": [FINALIZER],
    }


class LimitDefaults(Protocol):
    @property
    def max_steps(self) -> int: ...
    @property
    def max_wall_seconds(self) -> int: ...
    @property
    def max_concurrent_jobs(self) -> int: ...
    @property
    def max_job_timeout_seconds(self) -> int: ...


class TaskDefaults(Protocol):
    """What an Episode takes from its task when its spec leaves a field unset."""

    @property
    def limits(self) -> LimitDefaults: ...
    @property
    def default_flavors(self) -> list[str]: ...
    @property
    def grader_flavor(self) -> str | None: ...


@dataclass(frozen=True)
class Limits:
    max_steps: int
    max_wall_seconds: int
    max_concurrent_jobs: int
    max_job_timeout_seconds: int


def limits_in_force(spec: EpisodeSpec, task: TaskDefaults) -> Limits:
    """Each limit from the Episode's spec, else the task's default."""
    own, default = spec.limits, task.limits
    return Limits(
        max_steps=own.max_steps or default.max_steps,
        max_wall_seconds=own.max_wall_seconds or default.max_wall_seconds,
        max_concurrent_jobs=own.max_concurrent_jobs or default.max_concurrent_jobs,
        max_job_timeout_seconds=own.max_job_timeout_seconds or default.max_job_timeout_seconds,
    )


def allowed_flavors(spec: EpisodeSpec, task: TaskDefaults, status: EpisodeStatus | None = None) -> list[str]:
    """The flavors jobs may use, in order of preference (the first is the default): those fixed at start
    within the namespace's quota, else the Episode's own, else its task's."""
    if status is not None and status.flavors:
        return list(status.flavors)
    return list(spec.flavors or task.default_flavors)


def grader_flavor(spec: EpisodeSpec, task: TaskDefaults, status: EpisodeStatus | None = None) -> str:
    """The flavor of the episode's dev and score grader jobs: the task's, else the first allowed."""
    return task.grader_flavor or allowed_flavors(spec, task, status)[0]


class InvalidInputs(ValueError):
    """A train job's inputsFrom names a job it may not read; the message says which and why."""


def lineage_of(
    job_name: str, spec: AgentJobSpec, inputs: Mapping[str, Mapping[str, Any] | None]
) -> list[str]:
    """The jobs a train job builds on (its `inputsFrom`, then theirs, nearest first, each once), given
    each named job as read (None: not found). Raises InvalidInputs for the first input it may not
    read: only Succeeded train jobs of its own episode, other than itself."""
    lineage: list[str] = []
    for name in spec.inputs_from:
        found = inputs.get(name) or {}
        found_spec = found.get("spec") or {}
        found_status = status_of(AgentJobStatus, found.get("status"))
        if name == job_name:
            raise InvalidInputs("inputsFrom names the job itself")
        if not found or found_spec.get("episode") != spec.episode:
            raise InvalidInputs(f"inputsFrom: no job {name!r} in episode {spec.episode!r}")
        if found_spec.get("purpose") != "train":
            raise InvalidInputs(f"inputsFrom: {name!r} is a {found_spec.get('purpose')} job, not a train job")
        if found_status.phase != "Succeeded":
            phase = found_status.phase or "Pending"
            raise InvalidInputs(
                f"inputsFrom: {name!r} is {phase}; only a Succeeded job's outputs can be read"
            )
        lineage += [n for n in (name, *found_status.lineage) if n not in lineage]
    if len(lineage) > MAX_LINEAGE:
        raise InvalidInputs(f"inputsFrom: the lineage holds {len(lineage)} jobs; at most {MAX_LINEAGE}")
    return lineage


def jobs_running(ledger: Ledger) -> int:
    """Agent jobs holding a reservation: admitted and not yet settled (grader jobs do not count)."""
    return sum(1 for e in ledger.entries.values() if not e.platform and e.settled_micro_usd is None)


def budget_micro_usd(spec: EpisodeSpec, ledger: Ledger) -> int:
    """The ledger's budget once the operator has started the Episode; the spec's before that."""
    return ledger.budget_micro_usd or usd_to_micro(spec.budget_usd)


def remaining_micro_usd(spec: EpisodeSpec, ledger: Ledger) -> int:
    """What new reservations may still take: the budget less what is reserved and settled."""
    return max(0, budget_micro_usd(spec, ledger) - ledger.reserved_micro_usd - ledger.settled_micro_usd)


def steps_left(status: EpisodeStatus, limits: Limits) -> int:
    return max(0, limits.max_steps - status.steps)


def seconds_left(status: EpisodeStatus, now: datetime) -> int | None:
    """Whole seconds to the wall-time deadline; None until the operator has set one (at start)."""
    deadline = parse_time(status.deadline)
    if deadline is None:
        return None
    return max(0, math.ceil((deadline - now).total_seconds()))


def has_ended(status: EpisodeStatus) -> bool:
    return status.phase in ENDED_PHASES


def integrity_of(findings: list[IntegrityFinding]) -> Integrity:
    """The reward's label from its findings: any violation wins, any finding flags."""
    verdicts = {f.verdict for f in findings}
    label = "violation" if "violation" in verdicts else "flagged" if findings else "clean"
    return Integrity(label=label, findings=findings)


def token_hash(token: str) -> str:
    """What an Episode stores of its agent's bearer token: the sha256, hex."""
    return hashlib.sha256(token.encode()).hexdigest()


def stored_token_hash(body: Mapping[str, Any]) -> str | None:
    """The hash a token is checked against: the operator's copy in status, else the creator's in spec.
    Read from the raw body: the gateway runs this over every Episode of a namespace when it meets an
    unknown token, so it must not parse whole ledgers."""
    for part in ("status", "spec"):
        stored = (body.get(part) or {}).get("agentTokenHash")
        if isinstance(stored, str) and stored:
            return stored
    return None


def format_time(moment: datetime) -> str:
    """RFC 3339 in UTC with second precision, as Kubernetes writes times."""
    return moment.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | datetime | None) -> datetime | None:
    """An RFC 3339 time (a trailing `Z` included) as an aware datetime; None for None or ""."""
    if isinstance(value, datetime):
        return value
    if not value:
        return None
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def now_utc() -> datetime:
    return datetime.now(UTC)
