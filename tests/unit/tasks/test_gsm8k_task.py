"""The `gsm8k` task as its package declares it: registered through its own entry point, sized like
the benchmark by default, pointed elsewhere (or at the stand-in) by its settings, and refusing bad ones."""

from __future__ import annotations

from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import pytest

from graders import tasks
from graders.tasks import TaskRegistryError


@pytest.fixture
def installed() -> Iterator[None]:
    """The registry read afresh (settings are read when it loads), with the package installed as a lab
    would (`make venv` installs it beside the project)."""
    tasks._registry.cache_clear()
    yield
    tasks._registry.cache_clear()


def test_the_task_registers_through_its_entry_point_sized_like_the_benchmark(installed: None) -> None:
    registered = tasks.registered_task("gsm8k")
    assert registered.source == "entry point gsm8k = posttrain_task_gsm8k:PLUGIN"
    task = registered.task
    assert task.base_model is not None
    assert (task.base_model.repo_id, task.base_model.kind) == ("Qwen/Qwen3-1.7B-Base", "model")
    assert task.default_flavors == ["h200"] and task.grader_flavor == "h200"
    assert task.limits.max_wall_seconds == 10 * 3600
    assert Decimal(task.default_budget_usd) == Decimal("50.00")  # ten hours at h200's $5.00
    assert task.grader == "posttrain_task_gsm8k.grader" and task.agent_environment == "trl"
    # An 8 GB bf16 checkpoint fits in one file; the grader keeps a small result.
    assert task.agent_job_limits.max_file_bytes >= 8 * 10**9
    assert task.hidden_split.repo_id == "posttrain-operator/gsm8k-hidden"
    assert task.hidden_split.repo_id not in {r.repo_id for r in task.agent_datasets.values()}
    assert "gsm8k-hidden" not in task.public_view().model_dump_json()


def test_a_lab_points_the_task_at_another_base_and_flavor(
    installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTTRAIN_TASK_GSM8K_BASE_MODEL", "HuggingFaceTB/SmolLM3-3B-Base")
    monkeypatch.setenv("POSTTRAIN_TASK_GSM8K_BASE_REVISION", "0123456789abcdef0123456789abcdef01234567")
    monkeypatch.setenv("POSTTRAIN_TASK_GSM8K_FLAVOR", "a100-large")
    monkeypatch.setenv("POSTTRAIN_TASK_GSM8K_MAX_WALL_SECONDS", "7200")
    task = tasks.get_task("gsm8k")
    assert task.base_model is not None
    assert task.base_model.repo_id == "HuggingFaceTB/SmolLM3-3B-Base"
    assert task.base_model.revision == "0123456789abcdef0123456789abcdef01234567"
    assert task.default_flavors == ["a100-large"] and task.limits.max_wall_seconds == 7200


def test_the_stand_in_differs_only_in_its_repos(installed: None, monkeypatch: pytest.MonkeyPatch) -> None:
    real = tasks.get_task("gsm8k")
    tasks._registry.cache_clear()
    monkeypatch.setenv("POSTTRAIN_TASK_GSM8K_STANDIN", "true")
    standin = tasks.get_task("gsm8k")
    assert standin.base_model is not None
    assert standin.base_model.repo_id == "posttrain-operator/gsm8k-standin-base"
    assert standin.hidden_split.repo_id == "posttrain-operator/gsm8k-standin-hidden"
    repos = ("base_model", "agent_datasets", "dev_split", "hidden_split")
    assert standin.model_dump(exclude=set(repos)) == real.model_dump(exclude=set(repos))


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("POSTTRAIN_TASK_GSM8K_BASE_MODEL", "not a repo", "base_model"),
        ("POSTTRAIN_TASK_GSM8K_MAX_STEPS", "0", "max_steps"),
        ("POSTTRAIN_TASK_GSM8K_FLAVOR", "", "flavor"),
        ("POSTTRAIN_TASK_GSM8K_MAX_WALL_SECONDS", "-1", "max_wall_seconds"),
    ],
)
def test_a_bad_setting_stops_the_registry_naming_it(
    installed: None, monkeypatch: pytest.MonkeyPatch, variable: str, value: str, message: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(TaskRegistryError, match="entry point gsm8k") as caught:
        tasks.task_names()
    assert message in str(caught.value)


def test_limits_over_the_platforms_maxima_are_refused(
    installed: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTTRAIN_MAX_JOB_MAX_FILE_BYTES", str(12 << 30))  # files capped at 12 GiB
    with pytest.raises(TaskRegistryError, match=r"task 'gsm8k' asks for more than the platform allows"):
        tasks.task_names()


def test_the_example_agent_trains_on_the_prompt_the_grader_asks() -> None:
    """examples/train_gsm8k_sft.py copies the prompt from the task's description, as an agent would."""
    import importlib.util

    from posttrain_task_gsm8k.prompt import render

    path = Path(__file__).resolve().parents[3] / "examples" / "train_gsm8k_sft.py"
    spec = importlib.util.spec_from_file_location("train_gsm8k_sft", path)
    assert spec is not None and spec.loader is not None
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)  # defines; trains only as __main__
    question = "Tom has 3 apples and buys 4 more. How many apples does he have? "
    assert example.prompt(question) == render(question)
    assert render("QUESTION") in tasks.get_task("gsm8k").description.encode().decode("unicode_escape")
