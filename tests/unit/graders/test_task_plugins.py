"""Task plugins through real entry points: a distribution's metadata on sys.path, as `pip install`
leaves it, discovered by importlib.metadata; and what a broken or clashing plugin does."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from graders import tasks
from graders.tasks import AssetLocation, TaskRegistryError, UnknownTaskError

PLUGIN_MODULE = """
from graders.builtin_tasks import BUILTIN_TASKS
from graders.tasks import TaskPlugin

ARTIFACT = BUILTIN_TASKS[0].define


def define(assets):
    return ARTIFACT(assets).model_copy(update=dict(name=NAME, grader="{module}.grader"))


NAME = "{task}"
PLUGIN = TaskPlugin(define=define)
NOT_A_PLUGIN = object()
"""


@pytest.fixture
def site(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A directory on sys.path for installed distributions; the registry is reloaded around the test."""
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks._registry.cache_clear()
    yield tmp_path
    tasks._registry.cache_clear()


def install(site: Path, dist: str, module: str, entry_points: dict[str, str], task: str = "") -> None:
    (site / f"{module}.py").write_text(PLUGIN_MODULE.format(module=module, task=task or module))
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    lines = "".join(f"{name} = {value}\n" for name, value in entry_points.items())
    (info / "entry_points.txt").write_text(f"[{tasks.ENTRY_POINT_GROUP}]\n{lines}")
    sys.modules.pop(module, None)


def test_an_installed_plugin_is_registered_beside_the_builtin_tasks(site: Path) -> None:
    install(site, "lab-tasks", "lab_task", {"lab_task": "lab_task:PLUGIN"})
    assert "lab_task" in tasks.task_names()
    assert {"t0_artifact", "t0_arithmetic_format"} <= set(tasks.task_names())
    registered = tasks.registered_task("lab_task")
    assert registered.source == "entry point lab_task = lab_task:PLUGIN"
    assert registered.task.grader == "lab_task.grader"
    with pytest.raises(UnknownTaskError, match=r"known tasks: .*lab_task"):
        tasks.get_task("t9_no_such_task")


@pytest.mark.parametrize(
    ("entry_points", "task", "message"),
    [
        ({"bad_task": "bad_task:NOT_A_PLUGIN"}, "", "is a object, not a TaskPlugin"),
        ({"bad_task": "bad_task:MISSING"}, "", "AttributeError"),
        ({"bad_task": "no_such_module:PLUGIN"}, "", "ModuleNotFoundError"),
        ({"other_name": "bad_task:PLUGIN"}, "", "defines task 'bad_task'; name the entry point after it"),
        ({"t0_artifact": "bad_task:PLUGIN"}, "t0_artifact", "'t0_artifact' is already registered by builtin"),
        ({"bad_task": "bad_task:PLUGIN"}, "Bad-Name", "ValidationError"),
    ],
    ids=["not-a-plugin", "missing-attribute", "missing-module", "misnamed", "clash", "invalid-task"],
)
def test_a_broken_plugin_stops_the_registry_with_its_entry_point_named(
    site: Path, entry_points: dict[str, str], task: str, message: str
) -> None:
    install(site, "bad-tasks", "bad_task", entry_points, task=task)
    with pytest.raises(TaskRegistryError, match="entry point") as caught:
        tasks.task_names()
    assert message in str(caught.value)


def test_repos_are_placed_at_the_configured_namespace_and_revision(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("POSTTRAIN_TASK_ASSETS_NAMESPACE", "my-lab")
    monkeypatch.setenv("POSTTRAIN_TASK_ASSETS_REVISION", "v3")
    task = tasks.get_task("t0_arithmetic_format")
    refs = [task.base_model, *task.agent_datasets.values(), task.dev_split, task.hidden_split]
    placed = {(ref.repo_id.split("/")[0], ref.revision) for ref in refs if ref is not None}
    assert placed == {("my-lab", "v3")}
    assert task.hidden_split.repo_id == "my-lab/t0-arithmetic-hidden"


@pytest.mark.parametrize("namespace", ["", "../x", "a/b", "-lead"])
def test_a_bad_namespace_is_refused(monkeypatch: pytest.MonkeyPatch, namespace: str) -> None:
    monkeypatch.setenv("POSTTRAIN_TASK_ASSETS_NAMESPACE", namespace)
    with pytest.raises(ValueError, match="namespace"):
        AssetLocation()


def test_a_plugin_asking_for_more_than_the_platforms_maxima_is_refused_with_the_numbers(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(site, "lab-tasks", "lab_task", {"lab_task": "lab_task:PLUGIN"})
    # The builtin tasks' agent jobs keep a 2 GiB output tree and a 64 MiB log copy.
    monkeypatch.setenv("POSTTRAIN_MAX_JOB_MAX_OUTPUT_BYTES", str(1 << 30))
    monkeypatch.setenv("POSTTRAIN_MAX_JOB_MAX_LOG_FILE_BYTES", str(1 << 20))
    with pytest.raises(TaskRegistryError) as caught:
        tasks.task_names()
    message = str(caught.value)
    assert "asks for more than the platform allows" in message
    assert f"agent job max_output_bytes {2 << 30} > the platform's {1 << 30}" in message
    assert f"agent job max_log_file_bytes {64 << 20} > the platform's {1 << 20}" in message
    assert "grader job" not in message  # the graders' limits fit


def test_a_plugin_within_the_maxima_keeps_its_own_limits_in_its_public_view(
    site: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    install(site, "lab-tasks", "lab_task", {"lab_task": "lab_task:PLUGIN"})
    # The most the installed tasks ask for (gsm8k), far above the plugin's 2 GiB.
    monkeypatch.setenv("POSTTRAIN_MAX_JOB_MAX_OUTPUT_BYTES", str(48 << 30))
    view = tasks.get_task("lab_task").public_view()
    assert view.agent_job_limits.max_output_bytes == 2 << 30
    assert view.grader_job_limits.max_log_file_bytes == 0
