"""Pure reads of an Episode body: limits in force, spend, done and reward. No I/O, no state, injected
clock.

Every rule here is the operator's own (`posttrain_operator.api.rules`), so the gateway and the operator
cannot disagree on what is left or when an episode is over. A view's derived values (limits, spend,
...) are computed once, on first use; `env_gateway.parsed_views` keeps the views of recent bodies so
that each body is parsed once."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from functools import cached_property
from typing import Any

from posttrain_operator.api import rules
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import status_of
from posttrain_operator.api.money import micro_to_usd

from env_gateway.schemas import ServiceSpend, ToolFailure
from graders.tasks import Task, UnknownTaskError, get_task


@dataclass(frozen=True)
class EpisodeRef:
    """An Episode by name: what an orchestrator's session is attached to."""

    namespace: str
    name: str


@dataclass(frozen=True)
class EpisodeView:
    namespace: str
    name: str
    spec: EpisodeSpec
    status: EpisodeStatus
    task: Task
    body: dict[str, Any]

    @classmethod
    def parse(cls, body: dict[str, Any]) -> EpisodeView:
        """The view of an Episode body as read from the API server; its task must be registered.
        Callers go through `parsed_views.parse_episode`, which parses each body once."""
        try:
            task = get_task(body["spec"]["task"])
        except UnknownTaskError as exc:
            raise ToolFailure("unknown_task", str(exc)) from exc
        return cls.of(body, task)

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
    def ref(self) -> EpisodeRef:
        return EpisodeRef(self.namespace, self.name)

    @cached_property
    def limits(self) -> rules.Limits:
        return rules.limits_in_force(self.spec, self.task)

    @property
    def flavors(self) -> list[str]:
        return rules.allowed_flavors(self.spec, self.task, self.status)

    @property
    def grader_flavor(self) -> str:
        return rules.grader_flavor(self.spec, self.task, self.status)

    @property
    def max_steps(self) -> int:
        return self.limits.max_steps

    @cached_property
    def steps_left(self) -> int:
        return rules.steps_left(self.status, self.limits)

    def seconds_left(self, now: datetime) -> int | None:
        """None until the operator has started the episode (it sets the deadline)."""
        return rules.seconds_left(self.status, now)

    @cached_property
    def done(self) -> bool:
        return rules.has_ended(self.status)

    @property
    def reward(self) -> float | None:
        """The wire reward: a number once ended, None while running or when grading failed."""
        if not self.done or self.status.reward is None:
            return None
        return float(self.status.reward)

    def spend(self) -> ServiceSpend:
        ledger = self.status.ledger
        return ServiceSpend(
            budget_usd=micro_to_usd(rules.budget_micro_usd(self.spec, ledger)),
            reserved_usd=micro_to_usd(ledger.reserved_micro_usd),
            settled_usd=micro_to_usd(ledger.settled_micro_usd),
            remaining_usd=micro_to_usd(rules.remaining_micro_usd(self.spec, ledger)),
            jobs_running=rules.jobs_running(ledger),
        )

    @cached_property
    def _service_spend(self) -> dict[str, Any]:
        return self.spend().model_dump()

    def metadata(self, now: datetime) -> dict[str, Any]:
        """A new dict on every call (callers add to it); its parts are computed once per view."""
        return {
            "service_spend": dict(self._service_spend),
            "steps_left": self.steps_left,
            "seconds_left": self.seconds_left(now),
            "steps": self.status.steps,
            "max_steps": self.max_steps,
            "episode": self.name,
            "phase": self.status.phase or "Pending",
            "outcome": self.status.outcome,
            "reward_decimal": self.status.reward if self.done else None,
            "reward_interval": self._reward_interval(),
            "integrity": self._integrity(),
        }

    def _integrity(self) -> dict[str, Any] | None:
        """The reward's integrity label and what the findings behind it say, once scored."""
        integrity = self.status.integrity
        if not self.done or integrity is None:
            return None
        return {"label": integrity.label, "findings": [f"{f.check}: {f.summary}" for f in integrity.findings]}

    def _reward_interval(self) -> list[str] | None:
        """The reward's 95% interval as [low, high] decimal strings, once ended, where the grader gave one."""
        interval = self.status.reward_interval
        return [interval.low, interval.high] if self.done and interval is not None else None
