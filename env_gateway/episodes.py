"""What a caller may do to its episode: the one choke point every tool call goes through, and `reset`.

Transports (MCP SDK, the OpenEnv `/mcp` dialect, `/ws` step and `/ws` mcp) only translate wire
formats and establish who the caller is (`auth.Authenticator`); the episode's phase, the step and
wall-time limits and the durable step count all happen in `Episodes.call_tool`.
"""

from __future__ import annotations

import json
import logging
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from posttrain_operator.api import conditions as cond
from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.models import API_VERSION, status_of
from posttrain_operator.api.money import USD_PATTERN
from posttrain_operator.api.rules import (
    CREATED_BY_GATEWAY,
    CREATED_BY_LABEL,
    episode_owner,
    format_time,
    now_utc,
    token_hash,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from env_gateway.auth import Authenticator
from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeRef, EpisodeView
from env_gateway.kube import Kube, Refused, Unavailable
from env_gateway.metrics import GatewayMetrics
from env_gateway.parsed_views import parse_episode
from env_gateway.provenance import ProvenanceLog, tool_call
from env_gateway.schemas import Outcome, ToolFailure
from env_gateway.steps import CallRefused, StepCounter, StepLimitReached
from env_gateway.tool_jobs import ToolContext
from env_gateway.tools import TOOLS
from env_gateway.wire import UNAVAILABLE_CODE
from graders.tasks import Task, UnknownTaskError, get_task

log = logging.getLogger(__name__)
# Tools whose result cannot change the Episode: the observation reuses the body the step wrote.
READ_ONLY = {name for name, spec in TOOLS.items() if spec.read_only and name != "jobs_wait"}


class ResetArgs(BaseModel):
    """`reset` kwargs: create an Episode for `task`, or attach to an existing one by `episode`."""

    model_config = ConfigDict(extra="forbid")

    task: str | None = Field(default=None, max_length=64, pattern=r"^[a-z][a-z0-9_]*$")
    episode: str | None = Field(default=None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    episode_id: str | None = Field(default=None, max_length=253, description="OpenEnv's name for `episode`.")
    seed: int | None = Field(default=None, description="Accepted for OpenEnv clients; unused.")
    budget_usd: str | None = Field(default=None, pattern=USD_PATTERN)
    backend: str | None = Field(default=None, pattern="^(hf-jobs|pods)$")
    flavors: list[str] | None = Field(default=None, max_length=16)
    max_steps: int | None = Field(default=None, ge=1, le=100_000)
    max_wall_seconds: int | None = Field(default=None, ge=60, le=7 * 86400)
    max_concurrent_jobs: int | None = Field(default=None, ge=1, le=1000)
    max_job_timeout_seconds: int | None = Field(default=None, ge=60, le=86400)


@dataclass(frozen=True)
class ResetResult:
    episode: EpisodeView
    agent_token: str | None


class Episodes:
    def __init__(
        self,
        settings: GatewaySettings,
        kube: Kube,
        broker: BrokerClient,
        auth: Authenticator,
        clock: Callable[[], datetime] = now_utc,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.broker = broker
        self.auth = auth
        self.clock = clock
        self.metrics = metrics or GatewayMetrics(frozenset(TOOLS))
        self.provenance = ProvenanceLog(kube.append_provenance, kube.list_provenance)
        self.steps = StepCounter(
            kube.read_episode,
            kube.set_steps,
            lambda b: parse_episode(b).max_steps,
            # The step limit is the counter's own (it frees the steps it gives back first).
            lambda b: self._refusal(parse_episode(b), steps=False),
        )

    async def load(self, ref: EpisodeRef, *, fresh: bool = False) -> EpisodeView:
        read = self.kube.read_episode if fresh else self.kube.get_episode
        body = await read(ref.namespace, ref.name)
        if body is None:
            raise ToolFailure("episode_not_found", f"episode {ref.name!r} no longer exists")
        return parse_episode(body)

    # --- the choke point -----------------------------------------------------------------------

    async def call_tool(self, episode: EpisodeView, name: str, arguments: Any) -> Outcome:
        """Every tool call on every path, on the caller's episode (as just read): arguments, phase,
        step limit, wall time, a durable step count, then the tool. Every failure becomes an Outcome."""
        started = time.monotonic()
        counted: list[EpisodeView] = []
        try:
            outcome = await self._call_tool(episode, name, arguments, counted)
        except Unavailable:  # the transports answer it as retryable; no step was counted for it
            self.metrics.called(name, UNAVAILABLE_CODE, time.monotonic() - started)
            raise
        code = outcome.error.code if outcome.error is not None else None
        if counted:
            await self._record(counted[-1], name, arguments, code, outcome.result)
        self.metrics.called(name, code, time.monotonic() - started)
        return outcome

    async def _record(
        self, episode: EpisodeView, name: str, arguments: Any, code: str | None, result: dict[str, Any] | None
    ) -> None:
        """A counted call into the Episode's provenance; a failed write is retried in the background."""
        job = (result or {}).get("job")
        call = tool_call(
            name,
            arguments,
            code or "ok",
            episode.status.ledger.settled_micro_usd,
            format_time(self.clock()),
            job.get("name") if isinstance(job, dict) and isinstance(job.get("name"), str) else None,
        )
        try:
            await self.provenance.record(episode.namespace, episode.name, episode_owner(episode.body), call)
        except Exception as exc:
            log.warning(
                "episode %s/%s: a %s call is not recorded yet: %s", episode.namespace, episode.name, name, exc
            )

    async def _call_tool(
        self, episode: EpisodeView, name: str, arguments: Any, counted: list[EpisodeView]
    ) -> Outcome:
        """`counted` gets the Episode once the call's step is counted, and again as the call left it."""
        try:
            spec = TOOLS.get(name)
            if spec is None:
                raise ToolFailure(
                    "unknown_tool", f"no tool named {str(name)[:64]!r}", error_type="tool_not_found"
                )
            try:
                args = spec.args.model_validate(arguments if arguments is not None else {})
            except ValidationError as exc:
                raise ToolFailure(
                    "invalid_arguments", _validation_message(exc), error_type="invalid_args"
                ) from exc
            refusal = self._refusal(episode)
            if refusal is not None:
                raise refusal
            try:
                written = await self.steps.take(episode.namespace, episode.name, episode.body)
            except StepLimitReached as exc:
                raise ToolFailure("step_limit_reached", str(exc)) from exc
            except CallRefused as exc:  # it ended after the (mirrored) copy the limits were checked on
                episode = parse_episode(exc.body)
                raise exc.reason from None
            episode = parse_episode(written)
            counted.append(episode)
            try:
                result = await spec.run(ToolContext(self.kube, self.broker, self.settings, episode), args)
            except Unavailable as exc:
                if exc.maybe_applied and not spec.read_only:
                    # Its write may have landed: the call counts, and a retry could do it twice.
                    raise ToolFailure(
                        "outcome_unknown",
                        f"the platform failed while this call was writing ({exc.detail}); it may have "
                        "taken effect: look (jobs_status, task_info) before calling it again",
                    ) from exc
                self.steps.give_back(episode.namespace, episode.name, written)
                counted.clear()
                raise
            if name not in READ_ONLY:  # what the tool changed, from the API server if it wrote
                episode = await self._after(episode, fresh=not spec.read_only)
            payload = result if isinstance(result, dict) else result.model_dump(mode="json")
            counted.append(episode)
            return self._outcome(episode, name, result=payload)
        except ToolFailure as failure:
            if failure.code == "episode_done" and not episode.done:  # it ended while the tool ran
                episode = await self._after(episode, fresh=True)
            if counted:
                counted.append(episode)
            return self._outcome(episode, name, error=failure)

    async def _after(self, episode: EpisodeView, *, fresh: bool) -> EpisodeView:
        """The Episode after a tool ran: from the API server (`fresh`) or the copy, else as the caller
        had it (the API server went away, or the Episode did; the call ran and is answered)."""
        for from_server in (True, False) if fresh else (False,):
            try:
                return await self.load(episode.ref, fresh=from_server)
            except Unavailable:
                continue
            except ToolFailure:
                break
        return episode

    def _refusal(self, episode: EpisodeView, *, steps: bool = True) -> ToolFailure | None:
        """Why the episode, as read, takes no more calls; None while it does."""
        if episode.done:
            why = episode.status.message or episode.status.outcome or episode.status.phase
            return ToolFailure("episode_done", f"the episode ended ({why}); no more tool calls")
        if steps and episode.steps_left <= 0:
            return ToolFailure(
                "step_limit_reached", f"step limit reached ({episode.status.steps} of {episode.max_steps})"
            )
        if episode.seconds_left(self.clock()) == 0:
            return ToolFailure("time_limit_reached", "the episode's wall-time limit has passed")
        return None

    def _outcome(
        self,
        episode: EpisodeView,
        name: str,
        *,
        result: dict[str, Any] | None = None,
        error: ToolFailure | None = None,
    ) -> Outcome:
        metadata = episode.metadata(self.clock())
        done, reward = episode.done, episode.reward
        if error is not None:
            metadata["error_code"] = error.code
            metadata["error_details"] = error.details
            limit_hit = error.code in ("step_limit_reached", "time_limit_reached")
            if limit_hit and episode.spec.submission is None and not done:
                # The operator ends such an episode with reward 0 on its next tick: say so now.
                done, reward = True, 0.0
        return Outcome(
            tool_name=name, result=result, error=error, done=done, reward=reward, metadata=metadata
        )

    def observe(self, episode: EpisodeView) -> dict[str, Any]:
        return episode.metadata(self.clock())

    # --- reset (orchestrator) ------------------------------------------------------------------

    async def reset(self, raw: dict[str, Any]) -> ResetResult:
        try:
            args = ResetArgs.model_validate(raw)
        except ValidationError as exc:
            raise ToolFailure("invalid_reset", _validation_message(exc), error_type="invalid_args") from exc
        attach = args.episode or args.episode_id
        if attach:
            episode = await self.load(EpisodeRef(self.settings.namespace, attach))
            return ResetResult(episode, agent_token=None)
        try:
            task = get_task(args.task or self.settings.default_task)
        except UnknownTaskError as exc:
            raise ToolFailure("unknown_task", str(exc), error_type="invalid_args") from exc
        return await self._create_episode(task, args)

    async def _create_episode(self, task: Task, args: ResetArgs) -> ResetResult:
        token = self.auth.new_agent_token()
        limits = {
            k: v
            for k, v in {
                "maxSteps": args.max_steps,
                "maxWallSeconds": args.max_wall_seconds,
                "maxConcurrentJobs": args.max_concurrent_jobs,
                "maxJobTimeoutSeconds": args.max_job_timeout_seconds,
            }.items()
            if v is not None
        }
        spec: dict[str, Any] = {
            "task": task.name,
            "budgetUSD": args.budget_usd or task.default_budget_usd,
            "backend": args.backend or self.settings.default_backend,
            "limits": limits,
            "agentTokenHash": token_hash(token),
        }
        if args.flavors is not None:
            spec["flavors"] = args.flavors
        try:
            EpisodeSpec.model_validate(spec)
        except ValidationError as exc:
            raise ToolFailure("invalid_reset", _validation_message(exc), error_type="invalid_args") from exc
        body = {
            "apiVersion": API_VERSION,
            "kind": "Episode",
            "metadata": {
                "name": f"{task.name.replace('_', '-')}-{secrets.token_hex(4)}",
                "labels": {CREATED_BY_LABEL: CREATED_BY_GATEWAY},
            },
            "spec": spec,
        }
        try:
            created = await self.kube.create(self.settings.namespace, "episodes", body)
        except Refused as exc:
            raise ToolFailure("invalid_reset", f"the API server refused the Episode: {exc.detail}") from exc
        started = await self._await_start(created)
        self.auth.issued(token, created["metadata"]["name"])
        return ResetResult(parse_episode(started), agent_token=token)

    async def _await_start(self, body: dict[str, Any]) -> dict[str, Any]:
        """Wait (watch) for the operator to start the episode; a namespace blocked by orphaned jobs is a
        typed error, and the Episode we made is removed again."""

        def decided(obj: dict[str, Any]) -> bool:
            status = status_of(EpisodeStatus, obj.get("status"))
            return (
                status.phase not in (None, "Pending")
                or cond.holding(status.conditions, cond.BLOCKED) is not None
            )

        meta = body["metadata"]
        seen = await self.kube.wait_for(
            meta["namespace"], "episodes", meta["name"], decided, self.settings.reset_start_wait_seconds
        )
        body = seen or body
        status = status_of(EpisodeStatus, body.get("status"))
        blocking = cond.holding(status.conditions, cond.BLOCKED)
        if blocking is not None and status.phase in (None, "Pending"):
            await self.kube.delete_episode(meta["namespace"], meta["name"])
            raise ToolFailure("namespace_blocked", blocking.message or "orphaned jobs block new episodes")
        return body


def _validation_message(exc: ValidationError) -> str:
    errors = [
        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors()[:10]
    ]
    return json.dumps(errors)[:2000]
