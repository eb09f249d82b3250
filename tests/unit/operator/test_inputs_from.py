"""Jobs that build on jobs: which earlier outputs a train job may read, the lineage it records, and how
the backend-neutral request mounts them."""

from __future__ import annotations

import json
from typing import Any

import pytest
from posttrain_launcher.spec import parse_spec
from posttrain_operator.api import crds
from posttrain_operator.api.models import MAX_LINEAGE, AgentJobSpec
from posttrain_operator.api.rules import InvalidInputs, lineage_of
from posttrain_operator.jobspec import build_request, launcher_failure

from graders.tasks import get_task

pytestmark = pytest.mark.unit
TASK = get_task("t0_arithmetic_format")


def _spec(*inputs: str, purpose: str = "train") -> AgentJobSpec:
    return AgentJobSpec.model_validate(
        {"episode": "ep", "purpose": purpose, "script": "print(1)", "flavor": "cpu-basic",
         "timeoutSeconds": 60, "inputsFrom": list(inputs)}
    )  # fmt: skip


def _job(name: str, *, episode: str = "ep", purpose: str = "train", phase: str = "Succeeded",
         lineage: tuple[str, ...] = ()) -> dict[str, Any]:  # fmt: skip
    return {
        "metadata": {"name": name},
        "spec": {"episode": episode, "purpose": purpose},
        "status": {"phase": phase, "lineage": list(lineage)},
    }


def test_the_lineage_is_the_inputs_then_theirs_nearest_first_each_once() -> None:
    found = {
        "dpo": _job("dpo", lineage=("sft", "tok")),
        "sft": _job("sft", lineage=("tok",)),
    }
    assert lineage_of("grpo", _spec("dpo", "sft"), found) == ["dpo", "sft", "tok"]
    assert lineage_of("sft2", _spec(), {}) == []


@pytest.mark.parametrize(
    ("name", "found", "message"),
    [
        ("self", {"self": _job("self")}, "inputsFrom names the job itself"),
        ("j", {}, "no job 'a' in episode 'ep'"),
        ("j", {"a": _job("a", episode="other")}, "no job 'a' in episode 'ep'"),  # as if absent
        ("j", {"a": _job("a", purpose="devEval")}, "'a' is a devEval job, not a train job"),
        ("j", {"a": _job("a", purpose="score")}, "'a' is a score job, not a train job"),
        ("j", {"a": _job("a", phase="Failed")}, "'a' is Failed; only a Succeeded job's"),
        ("j", {"a": _job("a", phase="Running")}, "'a' is Running; only a Succeeded job's"),
        ("j", {"a": {**_job("a"), "status": {}}}, "'a' is Pending"),
    ],
    ids=["itself", "missing", "other-episode", "dev-eval", "score", "failed", "running", "new"],
)
def test_an_input_the_job_may_not_read_is_refused_with_the_reason(
    name: str, found: dict[str, Any], message: str
) -> None:
    inputs = ("self",) if name == "self" else ("a",)
    with pytest.raises(InvalidInputs, match=message):
        lineage_of(name, _spec(*inputs), found)


def test_a_lineage_past_its_bound_is_refused() -> None:
    deep = _job("a", lineage=tuple(f"j{i}" for i in range(MAX_LINEAGE)))
    with pytest.raises(InvalidInputs, match=f"holds {MAX_LINEAGE + 1} jobs; at most {MAX_LINEAGE}"):
        lineage_of("j", _spec("a"), {"a": deep})


def test_each_input_is_mounted_read_only_at_a_stable_path_and_named_by_its_place() -> None:
    request = build_request(spec=_spec("sft", "tok"), task=TASK, namespace="ns", job_name="j", uid="u")
    assert [(m.prefix, m.mount_path, m.read_only) for m in request.inputs_from] == [
        ("ns/ep/sft", "/inputs/from/sft", True),
        ("ns/ep/tok", "/inputs/from/tok", True),
    ]
    inputs = request.launcher_spec["inputs"]
    assert (inputs["from_0"], inputs["from_1"]) == ("/inputs/from/sft", "/inputs/from/tok")
    parsed = parse_spec(json.dumps(request.launcher_spec))  # the launcher takes it as it is
    assert parsed.inputs["from_0"] == "/inputs/from/sft"


def test_the_crd_refuses_inputs_from_on_grader_jobs_and_a_job_naming_itself() -> None:
    agentjobs = crds.render()["posttrain.dev_agentjobs.yaml"]
    schema = agentjobs["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    spec = schema["properties"]["spec"]
    assert spec["properties"]["inputsFrom"]["x-kubernetes-list-type"] == "set"
    assert spec["properties"]["inputsFrom"]["maxItems"] == 8
    rules = {r["message"]: r["rule"] for r in spec["x-kubernetes-validations"]}
    assert "self.purpose == 'train'" in rules["spec.inputsFrom is for train jobs only"]
    (whole,) = schema["x-kubernetes-validations"]
    assert whole["message"] == "spec.inputsFrom names the job itself"
    assert "self.metadata.name in self.spec.inputsFrom" in whole["rule"]


OUTPUT_CAP = (
    "posttrain-launcher: error: the job's outputs passed max_output_bytes (2147483648); it was stopped, "
    "its outputs removed"
)
FILE_CAP = "posttrain-launcher: error: shard.bin reached max_file_bytes (1024): a write past it was refused"


@pytest.mark.parametrize(
    ("code", "lines", "reason", "words"),
    [
        (2, ["posttrain-launcher: error: invalid job spec: x"], "LauncherRefused", "invalid job spec"),
        (3, ["step 9", OUTPUT_CAP, "[emulator] done"], "OutputCapExceeded", "max_output_bytes (2147483648)"),
        (4, ["OSError: [Errno 27] File too large", FILE_CAP], "FileSizeCapExceeded", "shard.bin reached"),
    ],
)
def test_the_launchers_verdict_names_the_cause_with_its_numbers(
    code: int, lines: list[str], reason: str, words: str
) -> None:
    named = launcher_failure(code, lines)
    assert named is not None and named[0] == reason and words in named[1]


@pytest.mark.parametrize(
    ("code", "lines"),
    [
        (3, ["Traceback ...", "SystemExit: 3"]),  # the script's own exit(3)
        (4, ["posttrain-launcher: error: something else"]),
        (3, [FILE_CAP]),  # the verdict of another code
        (1, [OUTPUT_CAP]),
        (None, [OUTPUT_CAP]),
    ],
    ids=["script-exit-3", "other-line", "wrong-verdict", "script-code", "no-code"],
)
def test_an_exit_code_without_its_verdict_is_the_scripts_own(code: int | None, lines: list[str]) -> None:
    assert launcher_failure(code, lines) is None
