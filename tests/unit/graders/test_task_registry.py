import json
import subprocess
import sys

import pytest
from pydantic import ValidationError

from graders.tasks import (
    AGENT_INPUT_MODEL,
    UnknownTaskError,
    all_tasks,
    get_task,
    package_name,
    task_names,
)

TASKS = all_tasks()
TASK_IDS = [task.name for task in TASKS]


def test_registry_imports_without_torch_or_transformers() -> None:
    code = (
        "import sys, graders.tasks, graders.result, graders.scoring, graders.checkpoint_files;"
        "heavy = sorted(m for m in ('torch', 'transformers', 'safetensors') if m in sys.modules);"
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_first_tasks_are_registered() -> None:
    assert {"t0_artifact", "t0_arithmetic_format"} <= set(task_names())
    assert get_task("t0_arithmetic_format").grader == "graders.arithmetic_format"
    assert get_task("t0_artifact").base_model is None


def test_unknown_task_error_lists_known_tasks() -> None:
    with pytest.raises(KeyError) as caught:
        get_task("t9_nope")
    assert isinstance(caught.value, UnknownTaskError)
    assert "t9_nope" in str(caught.value)
    assert "t0_artifact" in str(caught.value)


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_hidden_split_is_never_agent_mountable(task) -> None:
    mountable = [*task.agent_datasets.values(), task.dev_split, task.base_model]
    assert task.hidden_split not in mountable
    assert task.hidden_split.repo_id not in {ref.repo_id for ref in mountable if ref is not None}
    assert task.grader_split("devEval") == task.dev_split
    assert task.grader_split("score") == task.hidden_split


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_public_view_says_nothing_about_the_hidden_split(task) -> None:
    public = task.public_view().model_dump_json()
    assert task.hidden_split.repo_id not in public
    assert "hidden_split" not in public
    assert json.loads(public)["name"] == task.name
    # The split the agent may mount for checking is still there.
    assert set(json.loads(public)["agent_datasets"]) == set(task.agent_datasets)


@pytest.mark.parametrize("task", TASKS, ids=TASK_IDS)
def test_description_tells_the_agent_its_env_vars(task) -> None:
    assert "POSTTRAIN_OUTPUT_DIR" in task.description
    for mount in task.agent_datasets:
        assert f"POSTTRAIN_INPUT_{mount.upper()}" in task.description
    if task.base_model is not None:
        assert f"POSTTRAIN_INPUT_{AGENT_INPUT_MODEL.upper()}" in task.description


def test_a_task_sharing_its_hidden_split_is_refused() -> None:
    task = get_task("t0_arithmetic_format")
    fields = task.model_dump()
    fields["agent_datasets"] = {**fields["agent_datasets"], "peek": fields["hidden_split"]}
    with pytest.raises(ValidationError, match="hidden split"):
        type(task).model_validate(fields)


def test_budget_must_be_a_positive_decimal_string() -> None:
    fields = get_task("t0_artifact").model_dump()
    for bad in ("-1", "0", "abc", "NaN"):
        with pytest.raises(ValidationError):
            type(get_task("t0_artifact")).model_validate({**fields, "default_budget_usd": bad})


def test_grader_script_runs_the_task_grader_for_its_purpose() -> None:
    script = get_task("t0_artifact").grader_script("devEval")
    compile(script, "<grader>", "exec")
    assert "graders.run" in script
    assert "['--task', 't0_artifact', '--purpose', 'devEval']" in script


@pytest.mark.parametrize(
    ("requirement", "name"),
    [("Liger_Kernel>=0.5", "liger-kernel"), ("math.verify", "math-verify"), ("  trl == 1.0", "trl")],
)
def test_a_requirements_name_is_compared_as_pep_503_does(requirement: str, name: str) -> None:
    assert package_name(requirement) == name


def test_a_tasks_allow_list_refuses_every_other_package_and_names_them() -> None:
    trl = get_task("t0_arithmetic_format_trl")
    assert trl.package_refusal(["Liger_Kernel>=0.5", "math-verify==0.8"]) is None
    refused = trl.package_refusal(["numpy", "liger-kernel", "Requests"])
    assert refused is not None and "['numpy', 'requests'] are not allowed" in refused
    assert "allowed: latex2sympy2-extended, liger-kernel, math-verify" in refused
    assert get_task("t0_artifact").package_refusal(["anything"]) is None  # no allow-list: any
    assert trl.public_view().allowed_packages == sorted(trl.allowed_packages or ())
