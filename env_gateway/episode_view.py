"""Pure reads of an Episode body: limits in force, spend, done and reward. No I/O, injected clock."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from posttrain_operator.api.models import EpisodeSpec, EpisodeStatus, status_of
from posttrain_operator.api.money import micro_to_usd, usd_to_micro

from env_gateway.schemas import ServiceSpend
from graders.registry import Task

ENDED_PHASES = frozenset({"Completed", "Failed"})


@dataclass(frozen=True)
class EpisodeView:
    namespace: str
    name: str
    spec: EpisodeSpec
    status: EpisodeStatus
    task: Task
    body: dict[str, Any]

    @classmethod
    def of(cls, body: dict[str, Any], task: Task) -> EpisodeView:
        return cls(
            namespace=body["metadata"]["namespace"],
            name=body["metadata"]["name"],
            spec=EpisodeSpec.model_validate(body["spec"]),
            status=status_of(EpisodeStatus, body.get("status")),
            task=task,
            body=body,
        )

    @property
    def token_hash(self) -> str | None:
        return self.status.agent_token_hash or self.spec.agent_token_hash

    @property
    def max_steps(self) -> int:
        return self.spec.limits.max_steps or self.task.limits.max_steps

    @property
    def steps_left(self) -> int:
        return max(0, self.max_steps - self.status.steps)

    def seconds_left(self, now: datetime) -> int | None:
        """None until the operator has started the episode (it sets the deadline)."""
        if not self.status.deadline:
            return None
        deadline = datetime.fromisoformat(self.status.deadline.replace("Z", "+00:00"))
        return max(0, math.ceil((deadline - now).total_seconds()))

    @property
    def done(self) -> bool:
        return self.status.phase in ENDED_PHASES

    @property
    def reward(self) -> float | None:
        """The wire reward: a number once ended, None while running or when grading failed."""
        if not self.done or self.status.reward is None:
            return None
        return float(self.status.reward)

    def spend(self) -> ServiceSpend:
        ledger = self.status.ledger
        budget = ledger.budget_micro_usd or usd_to_micro(self.spec.budget_usd)
        remaining = max(0, budget - ledger.reserved_micro_usd - ledger.settled_micro_usd)
        running = sum(1 for e in ledger.entries.values() if not e.platform and e.settled_micro_usd is None)
        return ServiceSpend(
            budget_usd=micro_to_usd(budget),
            reserved_usd=micro_to_usd(ledger.reserved_micro_usd),
            settled_usd=micro_to_usd(ledger.settled_micro_usd),
            remaining_usd=micro_to_usd(remaining),
            jobs_running=running,
        )

    def metadata(self, now: datetime) -> dict[str, Any]:
        return {
            "service_spend": self.spend().model_dump(),
            "steps_left": self.steps_left,
            "seconds_left": self.seconds_left(now),
            "steps": self.status.steps,
            "max_steps": self.max_steps,
            "episode": self.name,
            "phase": self.status.phase or "Pending",
            "outcome": self.status.outcome,
            "reward_decimal": self.status.reward if self.done else None,
        }
