"""Operator settings: one typed object, read from POSTTRAIN_* environment variables at start-up."""

from __future__ import annotations

import os
import socket
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator
from pydantic.alias_generators import to_camel
from pydantic_settings import BaseSettings, SettingsConfigDict


class PodFlavor(BaseModel):
    """A pods-backend flavor: the resources a job pod gets, where it runs, and what a minute of it
    costs. Keys as in the chart's `pods.flavors` (camelCase; snake_case accepted too)."""

    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid")

    cpu: str = "1"  # the limit; also the request unless cpuRequest is lower
    memory: str = "2Gi"
    # /dev/shm, memory-backed (it counts toward `memory`): DataLoader workers and NCCL need more than
    # the runtime's 64 MiB.
    shm_size: str = "1Gi"
    cpu_request: str | None = None
    memory_request: str | None = None
    gpus: int = Field(default=0, ge=0)
    price_micro_usd_per_minute: int = Field(default=167, ge=0, alias="priceMicroUSDPerMinute")
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    queue: str | None = None  # Kueue LocalQueue (label kueue.x-k8s.io/queue-name)


class EgressProbe(BaseModel):
    """An address job pods must not reach (checked by their launcher before any job code)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(min_length=1, max_length=63)
    host: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)
    kind: Literal["tcp", "dns"] = "tcp"


class OperatorSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="POSTTRAIN_", env_nested_delimiter="__", extra="ignore")

    # Which operator instance this is: the label on every backend job it owns.
    instance: str = "posttrain-operator"
    annotation_prefix: str = "posttrain.dev"

    # HF Jobs. The token comes from a Secret through the environment and never leaves this process.
    hf_endpoint: str = "https://huggingface.co"
    hf_token: SecretStr | None = None
    # Set (by the chart) when HF Jobs is meant to run: then a missing or empty token is reported as
    # such rather than silently leaving the backend off. Unset: enabled exactly when a token is given.
    hf_jobs_enabled: bool | None = None
    # Where the token comes from, for messages (e.g. "Secret hf-token, key token"); never the token.
    hf_token_source: str = "POSTTRAIN_HF_TOKEN"
    hf_namespace: str | None = None
    hf_image: str = "ghcr.io/posttrain-operator/launcher:0.1.0"
    hf_bucket: str | None = None  # "<namespace>/<bucket>"; defaults to "<hf_namespace>/posttrain-outputs"
    hf_http_timeout_seconds: float = Field(default=30.0, gt=0)
    # Set only where the HF Jobs runtime gives each job a network namespace holding lo alone (the
    # devstack's emulator does; HF's own runtime gives jobs the network): agent jobs may then use TCP
    # and UDP on loopback, and their launcher checks the namespace before any job code runs.
    hf_jobs_loopback: bool = False
    # The index the operator resolves HF jobs' packages against (with their dependencies), and the
    # private dataset repo it commits their wheels to (default "<hf_namespace>/posttrain-packages").
    hf_package_index: str | None = None
    hf_package_repo: str | None = None
    hf_staging_dir: str | None = None  # where those wheels are downloaded first (default: the temp dir)
    max_package_bytes: int = Field(default=1 << 30, gt=0)  # one job's wheels, on either backend

    def launcher_image(self, backend: str) -> str:
        """The image a job without an environment image runs in on `backend`."""
        return self.hf_image if backend == "hf-jobs" else self.pods_image

    @property
    def submission_window_seconds(self) -> float:
        """How long a submission request may stay in flight: the HTTP timeout plus a margin."""
        return self.hf_http_timeout_seconds + 5.0

    # While a submission may be in flight, how often to look for the job it may have created: the
    # job is adopted as soon as it appears, not only when the window closes.
    submission_recheck_seconds: float = Field(default=5.0, gt=0)

    # Environment images by name (a task names the one its jobs run in), as the chart's
    # `environments` maps them; the same image on every backend. JSON: {"trl": "ghcr.io/...:tag"}.
    environment_images: dict[str, str] = Field(default_factory=dict)

    # Pods backend (off unless enabled: it needs RBAC for namespaces, pods and NetworkPolicies).
    pods_enabled: bool = False
    pods_image: str = "localhost/posttrain-launcher:0.1.0"
    pods_flavors: dict[str, PodFlavor] = Field(default_factory=lambda: {"cpu-basic": PodFlavor()})
    pods_namespace_prefix: str = "pt"  # episode namespaces are "<prefix>-<namespace>-<episode>-<hash>"
    # The artifact store: one Kubernetes volume source every episode namespace can mount (JSON, e.g.
    # {"nfs": {"server": "...", "path": "/posttrain"}}), and where this process mounts the same store.
    pods_store_volume: dict[str, Any] | None = None
    pods_store_path: str | None = None
    pods_scratch_size: str = "10Gi"
    pods_cancel_grace_seconds: int = Field(default=2, ge=0, le=5)
    # The launcher's egress check in every job pod (fails closed, exit 4). Probes besides the ones the
    # pod finds itself and the operator adds (its broker, the gateway): [{"name","host","port"}].
    pods_egress_check: bool = True
    pods_egress_probes: list[EgressProbe] = Field(default_factory=list)
    pods_egress_bound_seconds: float = Field(default=20.0, gt=0, le=300)
    pod_ip: str | None = None  # this operator's pod IP (Downward API): its broker is probed
    pods_gateway_host: str | None = None  # the gateway's Service name: resolved, then probed
    pods_gateway_port: int = Field(default=80, ge=1, le=65535)
    # The package index the operator stages jobs' `packages` from (job pods have no egress), and the
    # nodes' architecture.
    pods_package_index: str | None = None
    pods_package_arch: str = "x86_64"
    # The Localhost seccomp profile on the job nodes that lets each loopback job's launcher make its
    # user and network namespace (holding lo alone) after the egress check. None: jobs are AF_UNIX only.
    pods_loopback_seccomp_profile: str | None = None
    # The RuntimeClasses that sandbox a job from its node's kernel (gVisor, Kata): a flavor naming one
    # may run the jobs of a task that requires a sandbox (Task.requires_sandbox).
    pods_sandbox_runtime_classes: list[str] = Field(default_factory=lambda: ["gvisor"])

    # The internal broker API (logs, artifacts) that only the gateway's ServiceAccount may call.
    broker_host: str = "0.0.0.0"
    broker_port: int = Field(default=8081, ge=0, le=65535)
    broker_allowed_users: list[str] = Field(
        default_factory=lambda: ["system:serviceaccount:posttrain-system:posttrain-gateway"]
    )

    # One active replica per release: the Lease it holds (namespace unset: no election, for a single
    # process such as the devstack's). Others stand by and take over when it stops renewing.
    leader_election_namespace: str | None = None
    leader_election_name: str = "posttrain-operator"
    leader_election_identity: str = Field(default_factory=lambda: f"{socket.gethostname()}-{os.getpid()}")
    lease_duration_seconds: float = Field(default=15.0, ge=2)
    lease_renew_seconds: float = Field(default=5.0, gt=0)

    # The chart's ValidatingAdmissionPolicy that refuses an Episode naming a task not registered here:
    # the operator writes its registered tasks into it at start (unset: nothing to write).
    task_policy_name: str | None = None

    # How long kopf keeps the credentials it logged in with before logging in again (rereading a
    # rotated ServiceAccount token, or a kubeconfig's tokenFile) rather than waiting for a 401.
    credentials_refresh_seconds: float = Field(default=60.0, gt=0)

    # Prometheus metrics (GET /metrics), on their own port: the broker's is fenced to the gateway.
    metrics_host: str = "0.0.0.0"
    metrics_port: int = Field(default=8082, ge=0, le=65535)

    poll_interval_seconds: float = Field(default=10.0, gt=0)
    # The share of a provider's rate limit the status passes may use (HF's smallest tier allows 1,000
    # requests per 5 minutes: 200 a minute); a pass over many jobs costs a request per list page,
    # so with many jobs passes are spaced out to stay within it (deadlines are kept from the clock).
    poll_requests_per_minute: float = Field(default=120.0, gt=0)
    episode_tick_seconds: float = Field(default=2.0, gt=0)
    # The namespaces the operator serves (kopf's --namespace); empty: all of them.
    watch_namespaces: list[str] = Field(default_factory=list)
    # How often each BudgetQuota's figures are refreshed and its unsettled reservations reviewed.
    quota_tick_seconds: float = Field(default=10.0, gt=0)
    # How long after an Episode ends its provenance summary waits for the gateway's last tool calls.
    provenance_grace_seconds: float = Field(default=60.0, ge=0)
    orphan_retry_initial_seconds: float = Field(default=5.0, gt=0)
    orphan_retry_max_seconds: float = Field(default=300.0, gt=0)
    # Beyond a job's timeout, how long the operator waits for the backend before cancelling itself.
    job_deadline_grace_seconds: int = Field(default=60, ge=0)
    max_artifact_bytes: int = Field(default=1 << 20, gt=0)

    @model_validator(mode="after")
    def _hf_needs_a_namespace(self) -> OperatorSettings:
        if self.hf_enabled and not self.hf_namespace:
            raise ValueError(
                "POSTTRAIN_HF_NAMESPACE is required with POSTTRAIN_HF_TOKEN (never guessed by whoami)"
            )
        return self

    @model_validator(mode="after")
    def _renew_well_within_the_lease(self) -> OperatorSettings:
        if self.lease_renew_seconds * 2 > self.lease_duration_seconds:
            raise ValueError("POSTTRAIN_LEASE_RENEW_SECONDS must be at most half of the lease duration")
        return self

    @model_validator(mode="after")
    def _pods_need_a_store(self) -> OperatorSettings:
        if self.pods_enabled and (self.pods_store_volume is None or not self.pods_store_path):
            raise ValueError(
                "POSTTRAIN_PODS_ENABLED needs POSTTRAIN_PODS_STORE_VOLUME and POSTTRAIN_PODS_STORE_PATH "
                "(the artifact store, as the jobs and as the operator see it)"
            )
        return self

    @property
    def hf_enabled(self) -> bool:
        return self.hf_token is not None if self.hf_jobs_enabled is None else self.hf_jobs_enabled

    @property
    def hf_token_value(self) -> str | None:
        """The token, or None when it is missing or blank (an empty Secret key counts as missing)."""
        token = self.hf_token.get_secret_value().strip() if self.hf_token is not None else ""
        return token or None

    @property
    def hf_bucket_id(self) -> str:
        return self.hf_bucket or f"{self.hf_namespace}/posttrain-outputs"
