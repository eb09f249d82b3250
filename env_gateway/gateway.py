"""The gateway's core: who the caller is, and the one choke point every tool call goes through.

Transports (MCP SDK, the OpenEnv `/mcp` dialect, `/ws` step and `/ws` mcp) only translate wire
formats; authentication, the episode's phase, the step and wall-time limits and the durable step count
all happen in `Gateway.call_tool`.
"""

from __future__ import annotations

import hmac
import json
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from posttrain_operator.api.models import API_VERSION, EpisodeSpec
from posttrain_operator.api.money import USD_PATTERN
from posttrain_operator.api.rules import now_utc, stored_token_hash, token_hash
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from env_gateway.broker import BrokerClient
from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeView
from env_gateway.kube import Kube, Refused
from env_gateway.schemas import Outcome, ToolFailure
from env_gateway.steps import StepCounter, StepLimitReached
from env_gateway.tools import CREATED_BY, CREATED_BY_LABEL, TOOLS, ToolContext
from graders.tasks import Task, UnknownTaskError, get_task

MAX_TOKEN_CHARS = 512
# Tools whose result cannot change the Episode: the observation reuses the body the step wrote.
READ_ONLY = {name for name, spec in TOOLS.items() if spec.read_only and name != "jobs_wait"}


class AuthFailure(Exception):
    """401: no or unknown credential; 403: a valid credential on the wrong surface or episode."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message

    def body(self) -> dict[str, Any]:
        return {"error": {"code": self.code, "message": self.message}}


def bearer(header: str | None) -> str | None:
    if not header or len(header) > MAX_TOKEN_CHARS + 10:
        return None
    scheme, _, value = header.partition(" ")
    value = value.strip()
    return value if scheme.lower() == "bearer" and value else None


@dataclass(frozen=True)
class EpisodeRef:
    namespace: str
    name: str


@dataclass(frozen=True)
class AgentToken:
    token: str


# What a tool call is bound by: an agent token (agent surface) or an orchestrator session's episode.
Binding = AgentToken | EpisodeRef


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


class Gateway:
    def __init__(
        self,
        settings: GatewaySettings,
        kube: Kube,
        broker: BrokerClient,
        clock: Callable[[], datetime] = now_utc,
    ) -> None:
        self.settings = settings
        self.kube = kube
        self.broker = broker
        self.clock = clock
        self._by_hash: dict[str, str] = {}  # sha256(token) -> episode name, learned from lists
        self.steps = StepCounter(kube.get_episode, kube.set_steps, self._max_steps_of)

    # --- credentials ---------------------------------------------------------------------------

    def is_orchestrator(self, token: str | None) -> bool:
        expected = self.settings.orchestrator_token.get_secret_value().encode()
        return token is not None and hmac.compare_digest(token.encode(), expected)

    def require_orchestrator(self, token: str | None) -> None:
        if token is None:
            raise AuthFailure(
                401, "missing_token", "this surface needs `Authorization: Bearer <orchestrator token>`"
            )
        if not self.is_orchestrator(token):
            raise AuthFailure(401, "invalid_token", "not the orchestrator token")

    async def episode_for_token(self, token: str | None) -> EpisodeView:
        """The one Episode whose agentTokenHash is sha256(token), compared in constant time."""
        if token is None:
            raise AuthFailure(
                401, "missing_token", "the agent surface needs `Authorization: Bearer <agent token>`"
            )
        if self.is_orchestrator(token):
            raise AuthFailure(403, "wrong_surface", "the orchestrator token is not an agent token")
        digest = token_hash(token)
        name = self._by_hash.get(digest)
        if name is not None:
            body = await self.kube.get_episode(self.settings.namespace, name)
            if body is not None and self._matches(body, digest):
                return self._view(body)
            self._by_hash.pop(digest, None)
        matches = [
            b for b in await self.kube.list_episodes(self.settings.namespace) if self._matches(b, digest)
        ]
        if len(matches) != 1:
            # Zero: unknown or revoked. Several: refuse rather than guess (a token binds to one episode).
            raise AuthFailure(401, "invalid_token", "the token belongs to no episode")
        self._by_hash[digest] = matches[0]["metadata"]["name"]
        return self._view(matches[0])

    @staticmethod
    def _matches(body: dict[str, Any], digest: str) -> bool:
        stored = stored_token_hash(body)
        return stored is not None and hmac.compare_digest(stored.encode(), digest.encode())

    def _view(self, body: dict[str, Any]) -> EpisodeView:
        try:
            task = get_task(body["spec"]["task"])
        except UnknownTaskError as exc:
            raise ToolFailure("unknown_task", str(exc)) from exc
        return EpisodeView.of(body, task)

    def _max_steps_of(self, body: dict[str, Any]) -> int:
        return self._view(body).max_steps

    async def load(self, ref: EpisodeRef) -> EpisodeView:
        body = await self.kube.get_episode(ref.namespace, ref.name)
        if body is None:
            raise ToolFailure("episode_not_found", f"episode {ref.name!r} no longer exists")
        return self._view(body)

    async def resolve(self, binding: Binding) -> EpisodeView:
        if isinstance(binding, AgentToken):
            return await self.episode_for_token(binding.token)
        return await self.load(binding)

    # --- the choke point -----------------------------------------------------------------------

    async def call_tool(self, binding: Binding, name: str, arguments: Any) -> Outcome:
        """Every tool call on every path: credential -> episode, arguments, phase, step limit, wall
        time, a durable step count, then the tool. AuthFailure propagates (the transport answers
        401/403); everything else becomes an Outcome."""
        episode = await self.resolve(binding)
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
            self._check_limits(episode)
            try:
                written = await self.steps.take(episode.namespace, episode.name, episode.body)
            except StepLimitReached as exc:
                raise ToolFailure("step_limit_reached", str(exc)) from exc
            episode = self._view(written)
            result = await spec.run(ToolContext(self.kube, self.broker, self.settings, episode), args)
            if name not in READ_ONLY:
                episode = await self.load(EpisodeRef(episode.namespace, episode.name))
            payload = result if isinstance(result, dict) else result.model_dump(mode="json")
            return self._outcome(episode, name, result=payload)
        except ToolFailure as failure:
            return self._outcome(episode, name, error=failure)

    def _check_limits(self, episode: EpisodeView) -> None:
        if episode.done:
            raise ToolFailure(
                "episode_done",
                f"the episode ended ({episode.status.outcome or episode.status.phase}); no more tool calls",
            )
        if episode.steps_left <= 0:
            raise ToolFailure(
                "step_limit_reached", f"step limit reached ({episode.status.steps} of {episode.max_steps})"
            )
        if episode.seconds_left(self.clock()) == 0:
            raise ToolFailure("time_limit_reached", "the episode's wall-time limit has passed")

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
        token = secrets.token_urlsafe(32)
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
                "labels": {CREATED_BY_LABEL: CREATED_BY},
            },
            "spec": spec,
        }
        try:
            created = await self.kube.create(self.settings.namespace, "episodes", body)
        except Refused as exc:
            raise ToolFailure("invalid_reset", f"the API server refused the Episode: {exc.detail}") from exc
        started = await self._await_start(created)
        self._by_hash[token_hash(token)] = created["metadata"]["name"]
        return ResetResult(self._view(started), agent_token=token)

    async def _await_start(self, body: dict[str, Any]) -> dict[str, Any]:
        """Wait (watch) for the operator to start the episode; a namespace blocked by orphaned jobs is a
        typed error, and the Episode we made is removed again."""

        def decided(obj: dict[str, Any]) -> bool:
            status = obj.get("status") or {}
            blocked = any(
                c.get("type") == "Blocked" and c.get("status") == "True" for c in status.get("conditions", [])
            )
            return status.get("phase") not in (None, "Pending") or blocked

        meta = body["metadata"]
        seen = await self.kube.watch_until(
            meta["namespace"],
            "episodes",
            meta["name"],
            meta["resourceVersion"],
            self.settings.reset_start_wait_seconds,
            decided,
        )
        body = seen or await self.kube.get_episode(meta["namespace"], meta["name"]) or body
        status = body.get("status") or {}
        blocking = [
            c
            for c in status.get("conditions", [])
            if c.get("type") == "Blocked" and c.get("status") == "True"
        ]
        if blocking and status.get("phase") in (None, "Pending"):
            await self.kube.delete_episode(meta["namespace"], meta["name"])
            raise ToolFailure(
                "namespace_blocked", blocking[0].get("message", "orphaned jobs block new episodes")
            )
        return body


def _validation_message(exc: ValidationError) -> str:
    errors = [
        {"loc": ".".join(str(p) for p in e["loc"]), "msg": e["msg"], "type": e["type"]}
        for e in exc.errors()[:10]
    ]
    return json.dumps(errors)[:2000]
