"""The gateway's one settings object: every knob is a `GATEWAY_*` environment variable."""

from __future__ import annotations

from typing import Literal

from posttrain_operator.api.tokens import IN_CLUSTER_TOKEN
from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class GatewaySettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GATEWAY_", extra="forbid")

    namespace: str = Field(
        default="default", description="Namespace of the Episodes the gateway creates and attaches to."
    )
    orchestrator_token: SecretStr = Field(description="Bearer token of the orchestrator surface (/ws).")
    broker_url: str = Field(
        default="http://posttrain-operator-broker.posttrain-system.svc:8081",
        description="Base URL of the operator's internal broker API (logs, artifacts).",
    )
    broker_token_file: str = Field(
        default=IN_CLUSTER_TOKEN,
        description="The gateway's ServiceAccount token, presented to the broker (re-read as it rotates).",
    )
    kubeconfig: str | None = Field(
        default=None, description="Kubeconfig path; unset: KUBECONFIG, else the in-cluster config."
    )
    allowed_hosts: list[str] = Field(
        default_factory=lambda: ["127.0.0.1:*", "localhost:*", "[::1]:*"],
        description="Host headers the MCP transport accepts (DNS-rebinding protection).",
    )
    allowed_origins: list[str] = Field(
        default_factory=lambda: ["http://127.0.0.1:*", "http://localhost:*"],
        description="Origin headers the MCP transport accepts.",
    )
    default_task: str = Field(default="t0_artifact", description="Task of a `reset` that names none.")
    default_backend: str = Field(default="hf-jobs", pattern="^(hf-jobs|pods)$")
    max_sessions: int = Field(default=256, ge=1, le=100_000, description="OpenEnv sessions at once.")
    log_format: Literal["text", "json"] = Field(
        default="text", description="text: uvicorn's lines; json: one JSON object per line (logs.py)."
    )
    reset_start_wait_seconds: float = Field(
        default=30.0,
        gt=0,
        le=300,
        description="How long `reset` waits for the operator to start the episode.",
    )
    submit_admission_wait_seconds: float = Field(
        default=5.0, gt=0, le=20, description="How long jobs_submit waits for Admitted or Rejected."
    )
    max_wait_seconds: float = Field(
        default=240.0,
        gt=0,
        le=3600,
        description="Upper bound of one jobs_wait. The default stays under the 300 s an MCP SDK client "
        "reads for by default; the tool's own default (20 s) suits clients that give up at 30 s.",
    )
