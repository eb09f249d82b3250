"""The integrity checks a score job runs once the checkpoint graded: what its task's policy asks for,
as findings (graders/integrity/policy.py). Checks run on the score job's inputs only: the base model,
the hidden split, the checkpoint and the outputs of the jobs it was built on."""

from __future__ import annotations

import hashlib
import itertools

from graders.assets.datasets import read_jsonl
from graders.checkpoint import base_tensor_shapes, read_checkpoint_tensors
from graders.checkpoint_files import agent_bytes, checkpoint_root
from graders.inputs import GraderInputs
from graders.integrity import files, identity, text, wheels
from graders.integrity.policy import ContaminationPolicy, Finding, IdentityPolicy, verdict_of
from graders.tasks import DATASET_FILE, Task

# What the screen reads of the agent's outputs: text files, each and all together bounded.
MAX_SCREENED_FILE_BYTES = 64 << 20
MAX_SCREENED_BYTES = 1 << 30
# The launcher's copy of an agent job's script in its outputs (posttrain_launcher.launcher), at most
# the 256 KiB a script may be.
SCRIPT_COPY_NAME = "posttrain-script.py"
MAX_SCRIPT_COPY_BYTES = 256 * 1024


def integrity_findings(task: Task, inputs: GraderInputs) -> list[Finding]:
    findings: list[Finding] = []
    policy = task.integrity
    if policy.identity is not None and inputs.base_model is not None:
        findings += identity_findings(policy.identity, inputs)
    if policy.contamination is not None:
        findings += contamination_findings(policy.contamination, inputs)
    return findings


def identity_report(policy: IdentityPolicy, inputs: GraderInputs) -> identity.IdentityReport:
    assert inputs.base_model is not None
    expected = base_tensor_shapes(inputs.base_model)
    with agent_bytes("the checkpoint cannot be read"):  # it graded, so this is not expected to fail
        tensors = read_checkpoint_tensors(inputs.checkpoint, expected)
    return identity.compare(
        inputs.base_model,
        tensors,
        min_cosine=policy.min_cosine,
        min_kept_share=policy.min_kept_share,
        min_relative_change=policy.min_relative_change,
    )


def identity_findings(policy: IdentityPolicy, inputs: GraderInputs) -> list[Finding]:
    report = identity_report(policy, inputs)
    if report.verdict == "descendant":
        return []
    action = policy.foreign_action if report.verdict == "foreign" else policy.unchanged_action
    return [
        Finding(
            check="identity",
            verdict=verdict_of(action),
            summary=report.summary(),
            where=["checkpoint"],
            figures=report.figures(),
        )
    ]


def contamination_findings(policy: ContaminationPolicy, inputs: GraderInputs) -> list[Finding]:
    report, unaccounted = contamination_report(policy, inputs)
    findings: list[Finding] = []
    if unaccounted:
        findings.append(
            Finding(
                check="evidence",
                verdict=verdict_of(policy.action),
                summary=f"what {len(unaccounted)} job(s) the submission was built on ran was not screened: "
                f"the launcher's copy of the script ({SCRIPT_COPY_NAME} in the job's outputs) is missing "
                "or altered, or the job's AgentJob was deleted",
                where=[f"script:{job}" for job in unaccounted],
                figures={"scripts_expected": len(inputs.scripts), "scripts_unaccounted": len(unaccounted)},
            )
        )
    if len(report.contaminated) > policy.max_items:
        findings.append(
            Finding(
                check="contamination",
                verdict=verdict_of(policy.action),
                summary=report.summary(),
                where=report.where(),
                figures=report.figures(),
            )
        )
    return findings


def contamination_report(
    policy: ContaminationPolicy, inputs: GraderInputs
) -> tuple[text.ContaminationReport, list[str]]:
    """The hidden split screened against the submission's scripts and its lineage's outputs; and the
    jobs whose script could not be vouched for."""
    records = read_jsonl(inputs.split / DATASET_FILE)
    items = [tuple(str(record.get(field, "")) for field in policy.fields) for record in records]
    index = text.HiddenIndex.build(items, ngram=policy.ngram, min_item_tokens=policy.min_item_tokens)
    scripts, unaccounted = script_sources(inputs)
    roots = [("outputs:checkpoint", checkpoint_root(inputs.checkpoint))]
    roots += [(f"outputs:{job}", path) for job, path in inputs.lineage]
    stats = files.TextFileStats()  # one total for the wheels' members and the outputs' files
    packaged = wheels.wheel_texts(
        [(f"wheel:{job}", path) for job, path in inputs.wheels], max_member_bytes=MAX_SCREENED_FILE_BYTES,
        max_total_bytes=MAX_SCREENED_BYTES, stats=stats,
    )  # fmt: skip
    written = files.text_files(
        roots, max_file_bytes=MAX_SCREENED_FILE_BYTES, max_total_bytes=MAX_SCREENED_BYTES, stats=stats,
        skip=frozenset({SCRIPT_COPY_NAME}),
    )  # fmt: skip
    sources = itertools.chain(scripts, packaged, written)
    report = text.screen(index, sources, max_overlap=policy.max_overlap)
    return report, unaccounted


def script_sources(inputs: GraderInputs) -> tuple[list[tuple[str, str]], list[str]]:
    """The scripts the submission's jobs ran, as `script:<job>` sources, from the launcher's copy in
    each job's outputs whose sha256 is the one the operator passed; and the jobs whose copy is not."""
    mounted = dict(inputs.lineage)
    sources: list[tuple[str, str]] = []
    unaccounted: list[str] = []
    for position, (job, sha256) in enumerate(inputs.scripts):
        root = inputs.checkpoint if position == 0 else mounted.get(job)
        if root is None:  # the platform's failure: the grader result is `error`
            raise RuntimeError(f"job {job}'s outputs are not mounted, yet its script is expected")
        data = files.read_regular(root / SCRIPT_COPY_NAME, MAX_SCRIPT_COPY_BYTES)
        if data is None or hashlib.sha256(data).hexdigest() != sha256:
            unaccounted.append(job)
            continue
        sources.append((f"script:{job}", data.decode("utf-8", errors="replace")))
    return sources, unaccounted
