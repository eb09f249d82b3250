"""Episode: spec and status models. What the Episode and the AgentJob share, and the AgentJob's
own models, are in api.models."""

from __future__ import annotations

from pydantic import Field

from posttrain_operator.api.models import (
    CONDITIONS_LIST_TYPE,
    MAX_CONDITIONS,
    MAX_FINDINGS,
    MAX_ORPHANS,
    NAME_PATTERN,
    SHA256_PATTERN,
    ApiModel,
    Backend,
    Condition,
    EpisodePhase,
    IntegrityFinding,
    IntegrityLabel,
    NetworkMode,
    Outcome,
    ScoreInterval,
    micro_usd,
)
from posttrain_operator.api.money import USD_PATTERN


class EpisodeLimits(ApiModel):
    max_steps: int | None = Field(
        default=None, ge=1, le=100_000, description="maxSteps caps agent tool calls."
    )
    max_wall_seconds: int | None = Field(
        default=None, ge=1, le=7 * 86400, description="maxWallSeconds caps the episode's wall time."
    )
    max_concurrent_jobs: int | None = Field(
        default=None, ge=1, le=1000, description="maxConcurrentJobs caps jobs admitted and not finished."
    )
    max_job_timeout_seconds: int | None = Field(
        default=None, ge=60, le=86400, description="maxJobTimeoutSeconds caps any one job's timeoutSeconds."
    )


class Scoring(ApiModel):
    timeout_seconds: int | None = Field(
        default=None, ge=60, le=86400, description="timeoutSeconds bounds the hidden-split grader job."
    )


class Submission(ApiModel):
    checkpoint_from: str = Field(
        max_length=253,
        pattern=NAME_PATTERN,
        description="checkpointFrom names the AgentJob whose outputs are the final checkpoint.",
    )


class EpisodeSpec(ApiModel):
    task: str = Field(
        max_length=64, pattern=r"^[a-z][a-z0-9_]*$", description="task is a registry task name."
    )
    budget_usd: str = Field(
        alias="budgetUSD",
        pattern=USD_PATTERN,
        description="budgetUSD is the dollar budget, a decimal string.",
    )
    backend: Backend = Field(description="backend runs the episode's jobs: hf-jobs or pods.")
    flavors: list[str] | None = Field(
        default=None,
        max_length=16,
        description="flavors lists the hardware flavors jobs may use; defaults to the task's.",
    )
    limits: EpisodeLimits = Field(default_factory=EpisodeLimits, description="limits default to the task's.")
    scoring: Scoring = Field(default_factory=Scoring, description="scoring configures hidden-split grading.")
    submission: Submission | None = Field(
        default=None, description="submission is set exactly once; setting it starts hidden-split scoring."
    )
    agent_token_hash: str | None = Field(
        default=None,
        pattern=SHA256_PATTERN,
        description="agentTokenHash is the sha256 (hex) of the agent's bearer token, chosen by the creator.",
    )


class LedgerEntry(ApiModel):
    reserved_micro_usd: int = micro_usd(
        "reservedMicroUSD", "reservedMicroUSD is this job's worst case, held."
    )
    settled_micro_usd: int | None = Field(
        default=None, alias="settledMicroUSD", ge=0,
        description="settledMicroUSD is what the job cost once it ended; absent while it runs.",
    )  # fmt: skip
    platform: bool = Field(
        default=False, description="platform is true for grader spend not charged to the agent."
    )


class Ledger(ApiModel):
    budget_micro_usd: int = micro_usd("budgetMicroUSD", "budgetMicroUSD is spec.budgetUSD in micro-dollars.")
    reserved_micro_usd: int = micro_usd(
        "reservedMicroUSD",
        "reservedMicroUSD is the worst case of the jobs still running, held against the budget.",
    )
    settled_micro_usd: int = micro_usd(
        "settledMicroUSD",
        "settledMicroUSD is what ended agent jobs cost (billed minutes); never above the budget.",
    )
    platform_micro_usd: int = micro_usd("platformMicroUSD", "platformMicroUSD is grader spend for submit.")
    spent_usd: str = Field(
        default="0.00", alias="spentUSD", description="spentUSD is settled spend, in dollars."
    )
    reserved_usd: str = Field(default="0.00", alias="reservedUSD", description="reservedUSD in dollars.")
    entries: dict[str, LedgerEntry] = Field(
        default_factory=dict, description="entries holds one reservation or settlement per AgentJob name."
    )


class OrphanedJob(ApiModel):
    name: str = Field(description="name is the AgentJob whose cancellation the backend has not confirmed.")
    backend_job_id: str = Field(default="", description="backendJobId is that job's id on its backend.")
    since: str = Field(default="", description="since is when the cancellation first went unconfirmed.")
    attempts: int = Field(default=0, description="attempts counts the cancellations tried so far.")
    next_attempt_at: str = Field(
        default="", description="nextAttemptAt is when the next one is tried (backoff)."
    )


class EgressCounts(ApiModel):
    verified: int = Field(default=0, ge=0, description="verified counts jobs whose pod found egress closed.")
    open: int = Field(default=0, ge=0, description="open counts jobs stopped: their egress was open.")


class JobNetwork(ApiModel):
    mode: NetworkMode = Field(
        description="mode is unix (AF_UNIX sockets only) or loopback (TCP/UDP on lo too)."
    )
    reason: str = Field(
        default="", max_length=1024, description="reason says why the backend gives this mode."
    )


class ProvenanceSummary(ApiModel):
    format: str = Field(max_length=64, description="format is the records' format (docs/provenance.md).")
    tool_calls: int = Field(ge=0, description="toolCalls counts the tool calls recorded.")
    jobs: int = Field(ge=0, description="jobs counts the AgentJobs recorded.")
    billed_seconds: int = Field(ge=0, description="billedSeconds sums the recorded jobs' billed run time.")
    submission: bool = Field(description="submission: the submission's lineage is recorded.")
    chain: str = Field(
        max_length=256, description="chain is intact, or what is wrong with the tool-call records' chain."
    )


class Integrity(ApiModel):
    label: IntegrityLabel = Field(
        description="label is clean (no finding), flagged (findings recorded) or violation (reward withheld)."
    )
    findings: list[IntegrityFinding] = Field(
        default_factory=list, max_length=MAX_FINDINGS, description="findings are the score job's and judges'."
    )


class EpisodeStatus(ApiModel):
    phase: EpisodePhase | None = Field(
        default=None,
        description="phase is Pending, Running, Scoring, then Completed or Failed (could not run).",
    )
    outcome: Outcome | None = Field(
        default=None,
        description="outcome is how it ended: Scored, IntegrityViolation (reward 0: a finding the task "
        "withholds the reward for), LimitReached, GraderFailed or Cancelled.",
    )
    reward: str | None = Field(
        default=None, description="reward is a decimal string; null when GraderFailed."
    )
    integrity: Integrity | None = Field(
        default=None, description="integrity is the reward's label and the findings behind it, once scored."
    )
    provenance: ProvenanceSummary | None = Field(
        default=None,
        description="provenance summarises the Episode's ProvenanceRecords as they were when it ended.",
    )
    dev_evaluations: int = Field(
        default=0,
        ge=0,
        description="devEvaluations counts the devEval jobs admitted (the task may cap them).",
    )
    reward_interval: ScoreInterval | None = Field(
        default=None, description="rewardInterval is the reward's 95% interval, where the grader gives one."
    )
    message: str | None = Field(default=None, max_length=4096, description="message explains the phase.")
    ledger: Ledger = Field(
        default_factory=Ledger, description="ledger is the budget's accounting, in integer micro-dollars."
    )
    steps: int = Field(default=0, ge=0, description="steps counts agent tool calls (written by the gateway).")
    started_at: str | None = Field(default=None, description="startedAt is when the episode began Running.")
    deadline: str | None = Field(default=None, description="deadline is startedAt plus the wall-time limit.")
    ended_at: str | None = Field(default=None, description="endedAt is when the episode ended.")
    scoring_job: str | None = Field(
        default=None, description="scoringJob names the operator's hidden-split grader AgentJob."
    )
    flavors: list[str] | None = Field(
        default=None, max_length=16,
        description="flavors are the flavors its jobs may use, fixed when it starts where its namespace's "
        "BudgetQuota lists flavors: its own or its task's, narrowed to the quota's, in order.",
    )  # fmt: skip
    conditions: list[Condition] = Field(
        default_factory=list, max_length=MAX_CONDITIONS, json_schema_extra=CONDITIONS_LIST_TYPE,
        description="conditions: Ready, Ended (terminal: kubectl wait --for=condition=Ended), BackendReady, "
        "Blocked, Orphaned.",
    )  # fmt: skip
    orphaned_jobs: list[OrphanedJob] = Field(
        default_factory=list, max_length=MAX_ORPHANS,
        description="orphanedJobs lists jobs whose cancellation is unconfirmed; retried with backoff.",
    )  # fmt: skip
    backend_released: bool | None = Field(
        default=None,
        description="backendReleased: the episode's backend resources are gone (pods: its namespace).",
    )
    egress: EgressCounts | None = Field(
        default=None, description="egress counts the egress checks of this episode's job pods (pods backend)."
    )
    network: JobNetwork | None = Field(
        default=None, description="network is what the episode's agent jobs may do on the network, and why."
    )
    agent_token_hash: str | None = Field(
        default=None, pattern=SHA256_PATTERN, description="agentTokenHash is the sha256 of the agent's token."
    )
    agent_token_secret: str | None = Field(
        default=None, description="agentTokenSecret names the Secret holding a token the operator generated."
    )
    observed_generation: int | None = Field(
        default=None, description="observedGeneration is the spec generation the operator last acted on."
    )
