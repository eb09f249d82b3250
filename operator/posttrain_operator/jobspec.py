"""Build the backend-neutral `JobRequest` for an AgentJob: pure, unit-tested, no I/O.

What a job may see is decided here and only here: agent jobs get the base model and the task's
agent datasets; grader jobs get the base model, the graded job's outputs and one split. The hidden
split is mounted only for `score`.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from graders.job_limits import JobLimits
from graders.tasks import (
    AGENT_INPUT_MODEL,
    GRADER_INPUT_BASE_MODEL,
    GRADER_INPUT_CHECKPOINT,
    GRADER_INPUT_SPLIT,
    GraderPurpose,
    RepoRef,
    Task,
    evidence_input_name,
    wheels_input_name,
)
from posttrain_operator.api import conditions as cond
from posttrain_operator.api.models import AgentJobSpec, NetworkMode
from posttrain_operator.backends.base import JobRequest, OutputMount, RepoMount, StagedWheels

INPUTS_ROOT = "/inputs"
INPUTS_FROM_ROOT = f"{INPUTS_ROOT}/from"
EVIDENCE_ROOT = f"{INPUTS_ROOT}/lineage"
WHEELS_EVIDENCE_ROOT = f"{INPUTS_ROOT}/wheels"
OUTPUT_DIR = "/outputs"


# The launcher's own verdicts: its exit code, and the line it ends the job's log with. A script may
# exit with the same code, so only the two together name the cause (a job that prints the line as
# well only mislabels its own failure; nothing is charged or scored on it).
VERDICT_PREFIX = "posttrain-launcher: error: "
LAUNCHER_VERDICTS = {  # exit code -> (reason, words its verdict line holds)
    2: (cond.LAUNCHER_REFUSED, ""),
    3: (cond.OUTPUT_CAP_EXCEEDED, "passed max_output_bytes"),
    4: (cond.FILE_CAP_EXCEEDED, "reached max_file_bytes"),
    5: (cond.SCRATCH_CAP_EXCEEDED, "passed max_scratch_bytes"),
}


def launcher_failure(exit_code: int | None, last_lines: list[str]) -> tuple[str, str] | None:
    """A failed job's reason and message when the launcher ended it (its verdict line, which holds
    the numbers, is the message); None when the exit code is the script's own."""
    verdict = LAUNCHER_VERDICTS.get(exit_code) if exit_code is not None else None
    if verdict is None:
        return None
    reason, words = verdict
    for line in reversed(last_lines):
        if line.startswith(VERDICT_PREFIX) and words in line:
            return reason, line.removeprefix(VERDICT_PREFIX)
    return None


class InvalidJob(ValueError):
    """The AgentJob asks for something its task does not allow; the message says what."""


def idempotency_key(uid: str) -> str:
    return f"aj-{uid}"


def output_prefix(namespace: str, episode: str, job: str) -> str:
    return f"{namespace}/{episode}/{job}"


def _mount(name: str, ref: RepoRef) -> RepoMount:
    return RepoMount(
        kind=ref.kind, repo_id=ref.repo_id, revision=ref.revision, mount_path=f"{INPUTS_ROOT}/{name}"
    )


def validate_against_task(spec: AgentJobSpec, task: Task, flavors: list[str], max_timeout: int) -> None:
    if spec.flavor not in flavors:
        raise InvalidJob(
            f"flavor {spec.flavor!r} is not allowed in this episode; allowed: {', '.join(flavors)}"
        )
    if spec.timeout_seconds > max_timeout:
        raise InvalidJob(
            f"timeoutSeconds {spec.timeout_seconds} exceeds the episode's limit of {max_timeout}"
        )
    unknown = sorted(set(spec.datasets) - task.agent_datasets.keys())
    if unknown:
        allowed = ", ".join(sorted(task.agent_datasets)) or "none"
        raise InvalidJob(f"datasets {unknown} are not allowed for task {task.name}; allowed: {allowed}")
    if spec.purpose == "train" and not spec.script.strip():
        raise InvalidJob("a train job needs a script")
    refused = task.package_refusal(spec.packages)
    if refused is not None:
        raise InvalidJob(refused)
    if (spec.evidence_from or spec.evidence_scripts or spec.evidence_wheels) and spec.purpose != "score":
        raise InvalidJob("evidenceFrom, evidenceScripts, evidenceWheels: the operator's, for score jobs only")
    if not {w.job for w in spec.evidence_wheels} <= {spec.checkpoint_from, *spec.evidence_from}:
        raise InvalidJob("evidenceWheels names only checkpointFrom and jobs of evidenceFrom")
    if spec.evidence_scripts and len(spec.evidence_scripts) != 1 + len(spec.evidence_from):
        raise InvalidJob("evidenceScripts has one sha256 for checkpointFrom and one per evidenceFrom")
    if spec.purpose in ("devEval", "score"):
        if not spec.checkpoint_from:
            raise InvalidJob(f"a {spec.purpose} job needs checkpointFrom")
        if spec.script or spec.packages:
            raise InvalidJob(
                f"a {spec.purpose} job runs the task's grader: script and packages must be empty"
            )


def sample_seed(uid: str) -> int:
    """A dev evaluation's subsample seed: fresh for every job, the same for every attempt at one."""
    return int.from_bytes(hashlib.sha256(uid.encode()).digest()[:4], "big")


def input_from_name(index: int) -> str:
    """The launcher's input name of the `index`th of `inputsFrom` (POSTTRAIN_INPUT_FROM_<index>)."""
    return f"from_{index}"


def _outputs_of(namespace: str, episode: str, job: str, root: str) -> OutputMount:
    """Another job's outputs, read-only at `root`/<job>."""
    return OutputMount(
        prefix=output_prefix(namespace, episode, job), mount_path=f"{root}/{job}", read_only=True
    )


@dataclass
class _Mounts:
    """What a job reads, gathered as its purpose calls for; `inputs` names each for the launcher."""

    inputs: dict[str, str] = field(default_factory=dict)
    repos: list[RepoMount] = field(default_factory=list)
    inputs_from: list[OutputMount] = field(default_factory=list)
    wheels_from: list[StagedWheels] = field(default_factory=list)

    def add_outputs(self, name: str, mount: OutputMount) -> None:
        self.inputs_from.append(mount)
        self.inputs[name] = mount.mount_path


def _agent_launcher(
    spec: AgentJobSpec, task: Task, namespace: str, network: NetworkMode, limits: JobLimits, mounts: _Mounts
) -> dict[str, Any]:
    """A train job's launcher fields; its mounts: the base model, the outputs it reads, the datasets."""
    if task.base_model is not None:
        mounts.repos.append(_mount(AGENT_INPUT_MODEL, task.base_model))
    for index, source in enumerate(spec.inputs_from):
        mounts.add_outputs(
            input_from_name(index), _outputs_of(namespace, spec.episode, source, INPUTS_FROM_ROOT)
        )
    names = spec.datasets or sorted(task.agent_datasets)
    mounts.repos += [_mount(name, task.agent_datasets[name]) for name in names]
    return {
        "role": "agent",
        "network": network,
        "script": spec.script,
        "packages": list(spec.packages),
        "limits": limits.launcher_limits(),
    }


def _grader_launcher(
    spec: AgentJobSpec, task: Task, namespace: str, uid: str, limits: JobLimits, mounts: _Mounts
) -> dict[str, Any]:
    """A grader job's launcher fields; its mounts: the base model, the split, the checkpoint, and (a
    score job) the submission's lineage with its staged wheels."""
    assert spec.checkpoint_from is not None  # validate_against_task guarantees it
    if task.base_model is not None:
        mounts.repos.append(_mount(GRADER_INPUT_BASE_MODEL, task.base_model))
    purpose: GraderPurpose = "score" if spec.purpose == "score" else "devEval"
    split = task.grader_split(purpose)
    mounts.repos.append(_mount(GRADER_INPUT_SPLIT, split))
    checkpoint = OutputMount(
        prefix=output_prefix(namespace, spec.episode, spec.checkpoint_from),
        mount_path=f"{INPUTS_ROOT}/{GRADER_INPUT_CHECKPOINT}",
        read_only=True,
    )
    mounts.add_outputs(GRADER_INPUT_CHECKPOINT, checkpoint)
    for index, source in enumerate(spec.evidence_from):
        mounts.add_outputs(
            evidence_input_name(index), _outputs_of(namespace, spec.episode, source, EVIDENCE_ROOT)
        )
    for index, staged in enumerate(spec.evidence_wheels):
        wheels = StagedWheels(key=staged.key, mount_path=f"{WHEELS_EVIDENCE_ROOT}/{staged.job}")
        mounts.wheels_from.append(wheels)
        mounts.inputs[wheels_input_name(index)] = wheels.mount_path
    return {
        "role": "grader",
        "script": task.grader_script(
            purpose,
            sample_seed=sample_seed(uid) if purpose == "devEval" else None,
            scripts=list(
                zip([spec.checkpoint_from, *spec.evidence_from], spec.evidence_scripts, strict=False)
            ),
        ),
        "packages": [],
        "limits": limits.launcher_limits(),
    }


def build_request(
    *,
    spec: AgentJobSpec,
    task: Task,
    namespace: str,
    job_name: str,
    uid: str,
    network: NetworkMode = "unix",
    environment_images: Mapping[str, str] | None = None,
) -> JobRequest:
    """The backend-neutral request; `network` is the agent job's mode (grader jobs: unix always);
    `environment_images` maps the task's environment names to images (the episode's start checked
    that the task's are there)."""
    mounts = _Mounts()
    launcher: dict[str, Any] = {"version": 1, "output_dir": OUTPUT_DIR}
    limits = task.agent_job_limits if spec.purpose == "train" else task.grader_job_limits
    if spec.purpose == "train":
        launcher |= _agent_launcher(spec, task, namespace, network, limits, mounts)
    else:
        launcher |= _grader_launcher(spec, task, namespace, uid, limits, mounts)
    inputs, repos = mounts.inputs, mounts.repos
    for repo in repos:
        inputs[repo.mount_path.rsplit("/", 1)[-1]] = repo.mount_path
    launcher["inputs"] = dict(sorted(inputs.items()))
    environment = task.agent_environment if spec.purpose == "train" else task.grader_environment
    image = (environment_images or {})[environment] if environment is not None else None
    return JobRequest(
        key=idempotency_key(uid),
        namespace=namespace,
        episode=spec.episode,
        job_name=job_name,
        flavor=spec.flavor,
        timeout_seconds=spec.timeout_seconds,
        launcher_spec=launcher,
        repos=tuple(repos),
        outputs=OutputMount(prefix=output_prefix(namespace, spec.episode, job_name), mount_path=OUTPUT_DIR),
        inputs_from=tuple(mounts.inputs_from),
        wheels_from=tuple(mounts.wheels_from),
        scratch_bytes=limits.scratch_bytes,
        image=image,
        environment=environment,
    )
