"""What the Episode and AgentJob models share, and the AgentJob's spec and status models (the
Episode's are in api.episode).

Field descriptions become `kubectl explain` text, bounds become the CRD's OpenAPI bounds, so the API
server refuses bad input before the operator sees it. Python names are snake_case; the wire is
camelCase (the aliases).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

GROUP = "posttrain.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
# On every object that belongs to an Episode (its AgentJobs, its token Secret, its provenance records,
# pods-backend namespaces).
EPISODE_LABEL = f"{GROUP}/episode"

MAX_SCRIPT_BYTES = 256 * 1024
MAX_PACKAGES = 32
MAX_REQUIREMENT_CHARS = 200
MAX_DATASETS = 8
MAX_INPUTS_FROM = 8
MAX_LINEAGE = 64
MAX_INSTALLED_PACKAGES = 64  # one job's packages with their dependencies
MAX_ARTIFACTS = 100
MAX_CONDITIONS = 16
MAX_FINDINGS = 32  # a score job's few and a judge's
MAX_ORPHANS = 1000
NAME_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
SHA256_PATTERN = r"^[0-9a-f]{64}$"


def within_script_bytes(script: str) -> str:
    """The script limit is in bytes (UTF-8), at every layer: a character can take four."""
    if len(script.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES:
        raise ValueError(f"script is larger than {MAX_SCRIPT_BYTES} bytes (UTF-8)")
    return script


Script = Annotated[str, AfterValidator(within_script_bytes)]
JobName = Annotated[str, Field(max_length=253, pattern=NAME_PATTERN)]
Backend = Literal["hf-jobs", "pods"]
# What an agent job may do on the network: AF_UNIX only, or TCP/UDP on its own loopback as well.
NetworkMode = Literal["unix", "loopback"]
EpisodePhase = Literal["Pending", "Running", "Scoring", "Completed", "Failed"]
Outcome = Literal["Scored", "IntegrityViolation", "LimitReached", "GraderFailed", "Cancelled"]
IntegrityLabel = Literal["clean", "flagged", "violation"]
Purpose = Literal["train", "devEval", "score"]
JobPhase = Literal[
    "Pending", "Admitted", "Running", "Succeeded", "Failed", "Cancelled", "Rejected", "Orphaned"
]
TERMINAL_JOB_PHASES: frozenset[str] = frozenset({"Succeeded", "Failed", "Cancelled", "Rejected"})


class ApiModel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="forbid",
        validate_assignment=True,
    )

    def wire(self) -> dict[str, Any]:
        """The JSON-ready camelCase form, without unset optional fields."""
        return self.model_dump(mode="json", by_alias=True, exclude_none=True)

    def patch(self) -> dict[str, Any]:
        """This model as a JSON merge patch: the fields it was parsed or built with and every field
        updated since (a model_copy update counts); one updated to None is removed."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def micro_usd(alias: str, description: str) -> Any:
    """A field of micro-dollars, never negative, 0 until set; the alias spells USD in capitals, as the
    camelCase generator would not."""
    return Field(default=0, alias=alias, ge=0, description=description)


def job_names(max_length: int, description: str) -> Any:
    """A field of other jobs' names, each at most once (a set to the API server too), none by default."""
    return Field(
        default_factory=list,
        max_length=max_length,
        description=description,
        json_schema_extra={"x-kubernetes-list-type": "set"},
    )


# A conditions list is a map keyed by type (as metav1.Condition lists are): a server-side apply
# merges one condition without taking over the others, and a duplicate type is refused.
CONDITIONS_LIST_TYPE: dict[str, Any] = {
    "x-kubernetes-list-type": "map",
    "x-kubernetes-list-map-keys": ["type"],
}


class Condition(ApiModel):
    """A Kubernetes-style condition; lastTransitionTime changes only when status flips."""

    type: str = Field(
        max_length=64, description="type is the condition's name, e.g. Ready, Blocked, Orphaned."
    )
    status: Literal["True", "False", "Unknown"] = Field(description="status is True, False or Unknown.")
    reason: str = Field(
        default="", max_length=128, description="reason is a PascalCase machine-readable cause."
    )
    message: str = Field(default="", max_length=4096, description="message is a human-readable explanation.")
    last_transition_time: str = Field(
        default="",
        description="lastTransitionTime is when status last changed.",
        json_schema_extra={"format": "date-time"},
    )
    observed_generation: int = Field(
        default=0, ge=0, description="observedGeneration is the spec generation seen."
    )


# --- AgentJob (the Episode's models are in api.episode) ---------------------------------------


class EvidenceWheels(ApiModel):
    job: JobName = Field(description="job names the AgentJob that installed the wheels.")
    key: str = Field(
        max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
        description="key is its idempotency key, under which its backend staged them.",
    )  # fmt: skip


class AgentJobSpec(ApiModel):
    episode: str = Field(
        max_length=253, pattern=NAME_PATTERN, description="episode names the owning Episode."
    )
    purpose: Purpose = Field(description="purpose is train, devEval, or score (score: operator only).")
    script: Script = Field(
        default="",
        max_length=MAX_SCRIPT_BYTES,
        description="script is the Python source the launcher runs (train jobs).",
    )
    packages: list[str] = Field(
        default_factory=list,
        max_length=MAX_PACKAGES,
        description="packages are pip requirement strings, installed as wheels only.",
    )
    flavor: str = Field(max_length=64, pattern=r"^[a-z0-9-]+$", description="flavor is the hardware flavor.")
    timeout_seconds: int = Field(ge=60, le=86400, description="timeoutSeconds is the job's hard time limit.")
    datasets: list[str] = Field(
        default_factory=list,
        max_length=MAX_DATASETS,
        description="datasets are mount names from the task's allowed datasets.",
    )
    checkpoint_from: str | None = Field(
        default=None,
        max_length=253,
        pattern=NAME_PATTERN,
        description="checkpointFrom names the AgentJob whose outputs are graded (devEval and score).",
    )
    inputs_from: list[JobName] = job_names(
        MAX_INPUTS_FROM,
        "inputsFrom names earlier Succeeded train jobs of the same episode whose outputs this train job "
        "reads, read-only, at POSTTRAIN_INPUT_FROM_<i> in this order.",
    )
    evidence_from: list[JobName] = job_names(
        MAX_LINEAGE,
        "evidenceFrom names the jobs whose outputs a score job screens for the hidden split (the "
        "submission's lineage); set by the operator only.",
    )
    evidence_scripts: list[Annotated[str, Field(pattern=SHA256_PATTERN)]] = Field(
        default_factory=list,
        max_length=MAX_LINEAGE + 1,
        description="evidenceScripts are the sha256 of the scripts of checkpointFrom, then of each of "
        "evidenceFrom: the score job screens the launcher's copy of each that matches; set by the "
        "operator only.",
    )
    evidence_wheels: list[EvidenceWheels] = Field(
        default_factory=list,
        max_length=MAX_LINEAGE + 1,
        description="evidenceWheels are the jobs of checkpointFrom and evidenceFrom that installed "
        "packages, with their backend keys: the score job screens the wheels staged for each; set by "
        "the operator only.",
    )


class Artifact(ApiModel):
    path: str = Field(max_length=1024, description="path is relative to the job's outputs.")
    size: int = Field(ge=0, description="size is in bytes.")


class MountedRepo(ApiModel):
    mount: str = Field(max_length=64, description="mount is the input's name in the job.")
    repo: str = Field(max_length=200, description="repo is the Hub repo id.")
    revision: str = Field(max_length=200, description="revision is the revision mounted.")


class InstalledPackage(ApiModel):
    name: str = Field(max_length=128, description="name is the project's name (PEP 503).")
    version: str = Field(max_length=64, description="version is the wheel's, as installed.")
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$", description="sha256 is the wheel's, as installed.")


class JobRuntime(ApiModel):
    runtime_class: str = Field(
        alias="runtimeClass", max_length=253,
        description="runtimeClass is the job pod's RuntimeClass; empty for the node's default runtime.",
    )  # fmt: skip
    kernel: str | None = Field(
        default=None, max_length=256,
        description="kernel is the kernel release and version the job's launcher saw before any job code "
        "(gVisor reports its own); the job could rewrite it after.",
    )  # fmt: skip


class IntegrityFinding(ApiModel):
    check: str = Field(
        max_length=32, description="check is what found it: contamination, identity, devEvaluations or judge."
    )
    verdict: Literal["flagged", "violation"] = Field(
        description="verdict is flagged (recorded; the reward stands) or violation (the reward is withheld)."
    )
    summary: str = Field(max_length=512, description="summary says what was found, with its figures.")
    where: list[str] = Field(
        default_factory=list, max_length=8, description="where names the sources it was found in (bounded)."
    )
    figures: dict[str, str] = Field(
        default_factory=dict, max_length=16, description="figures are the check's numbers, as strings."
    )
    source: str | None = Field(
        default=None, max_length=253, description="source names the JudgeFinding that appended it (judges')."
    )


class ScoreInterval(ApiModel):
    low: str = Field(max_length=16, description="low is the interval's lower end, a decimal string.")
    high: str = Field(max_length=16, description="high is the interval's upper end, a decimal string.")


class GradeResult(ApiModel):
    status: str = Field(max_length=64, description="status is ok, invalid_checkpoint or error.")
    score: str | None = Field(default=None, description="score is a decimal string in [0, 1].")
    interval: ScoreInterval | None = Field(
        default=None, description="interval is the score's 95% interval, where the grader reports one."
    )
    n: int | None = Field(default=None, description="n is the number of examples graded.")
    reason: str | None = Field(
        default=None,
        max_length=4096,
        description="reason explains a non-ok status (or what an ok one skipped).",
    )
    grader_version: str | None = Field(default=None, description="graderVersion identifies the grader.")
    findings: list[IntegrityFinding] | None = Field(
        default=None, max_length=MAX_FINDINGS, description="findings are a score job's integrity checks'."
    )


class AgentJobStatus(ApiModel):
    phase: JobPhase | None = Field(
        default=None,
        description="phase is Pending, Admitted, Running, then Succeeded, Failed, Cancelled or Rejected; "
        "Orphaned while a cancellation is unconfirmed.",
    )
    reason: str | None = Field(
        default=None, max_length=128, description="reason is a PascalCase cause (e.g. BudgetExceeded)."
    )
    message: str | None = Field(default=None, max_length=4096, description="message explains the phase.")
    conditions: list[Condition] = Field(
        default_factory=list, max_length=MAX_CONDITIONS, json_schema_extra=CONDITIONS_LIST_TYPE,
        description="conditions: Admitted, Submitted, Complete, Finished (terminal: kubectl wait "
        "--for=condition=Finished), EgressVerified (pods backend).",
    )  # fmt: skip
    backend: Backend | None = Field(default=None, description="backend is where the job runs.")
    backend_job_id: str | None = Field(default=None, description="backendJobId is the job's id there.")
    backend_stage: str | None = Field(
        default=None, description="backendStage is the backend's own stage (e.g. SCHEDULING, RUNNING)."
    )
    idempotency_key: str | None = Field(
        default=None, description="idempotencyKey labels the backend job; written before it is submitted."
    )
    submit_started_at: str | None = Field(
        default=None, description="submitStartedAt is when the last submission call began (crash-safety)."
    )
    reserved_micro_usd: int = micro_usd("reservedMicroUSD", "reservedMicroUSD is the worst case held.")
    settled_micro_usd: int = micro_usd("settledMicroUSD", "settledMicroUSD is what the agent was charged.")
    spent_usd: str | None = Field(default=None, alias="spentUSD", description="spentUSD is that, in dollars.")
    reserved_usd: str | None = Field(
        default=None, alias="reservedUSD", description="reservedUSD is the reservation, in dollars."
    )
    billed_seconds: int | None = Field(
        default=None, ge=0, description="billedSeconds is the run time billed (per started minute)."
    )
    started_at: str | None = Field(default=None, description="startedAt is when the backend started it.")
    finished_at: str | None = Field(default=None, description="finishedAt is when it ended.")
    exit_code: int | None = Field(
        default=None, description="exitCode is the job process's exit code, where the backend reports one."
    )
    artifacts: list[Artifact] = Field(
        default_factory=list,
        max_length=MAX_ARTIFACTS,
        description="artifacts lists the job's outputs (bounded).",
    )
    result: GradeResult | None = Field(default=None, description="result is a grader job's score.")
    network: NetworkMode | None = Field(
        default=None, description="network is the job's network mode (see the Episode's status.network)."
    )
    runtime: JobRuntime | None = Field(default=None, description="runtime is where the job ran (pods).")
    lineage: list[JobName] = Field(
        default_factory=list,
        max_length=MAX_LINEAGE,
        description="lineage lists the jobs whose outputs this job built on (inputsFrom, then theirs, "
        "nearest first); recorded at admission.",
    )
    packages: list[InstalledPackage] = Field(
        default_factory=list,
        max_length=MAX_INSTALLED_PACKAGES,
        description="packages are the wheels installed for spec.packages, their dependencies included, "
        "pinned by sha256; recorded at submission where the backend resolves them (pods).",
    )
    image: str | None = Field(
        default=None, max_length=512, description="image is the image the backend was asked to run it in."
    )
    mounts: list[MountedRepo] = Field(
        default_factory=list, max_length=MAX_DATASETS + 3,
        description="mounts are the Hub repos it reads, at their revisions; recorded at submission.",
    )  # fmt: skip
    observed_generation: int | None = Field(
        default=None, description="observedGeneration is the spec generation the operator last acted on."
    )


StatusModel = TypeVar("StatusModel", bound=BaseModel)


def status_of(model: type[StatusModel], raw: dict[str, Any] | None) -> StatusModel:
    """Parse a status, keeping only fields we own (kopf adds its own bookkeeping keys)."""
    known = {f.alias or name for name, f in model.model_fields.items()}
    return model.model_validate({k: v for k, v in (raw or {}).items() if k in known})
