"""Invariant 4: the hidden split is under no path an agent job mounts or a tool can list."""

from pathlib import Path

import pytest

from graders.assets import referenced_repos, repo_path
from graders.assets.datasets import arithmetic_splits, artifact_checks
from graders.tasks import AGENT_INPUT_MODEL, all_tasks

TASKS = all_tasks()


@pytest.mark.parametrize("task", TASKS, ids=[task.name for task in TASKS])
def test_hidden_split_dir_is_outside_every_agent_mount(task, tmp_path: Path) -> None:
    hidden = repo_path(tmp_path, task.hidden_split)
    agent_mounts = {**task.agent_datasets}
    if task.base_model is not None:
        agent_mounts[AGENT_INPUT_MODEL] = task.base_model
    for ref in agent_mounts.values():
        mounted = repo_path(tmp_path, ref)
        assert not hidden.is_relative_to(mounted)
        assert not mounted.is_relative_to(hidden)


def test_every_referenced_repo_has_its_own_dir(tmp_path: Path) -> None:
    paths = [repo_path(tmp_path, ref) for ref in referenced_repos()]
    for index, path in enumerate(paths):
        for other in paths[index + 1 :]:
            assert not path.is_relative_to(other)
            assert not other.is_relative_to(path)


def test_arithmetic_splits_are_disjoint_and_seeded() -> None:
    splits = arithmetic_splits()
    prompts = {name: {record["prompt"] for record in records} for name, records in splits.items()}
    assert not prompts["hidden"] & prompts["train"]
    assert not prompts["hidden"] & prompts["dev"]
    assert not prompts["dev"] & prompts["train"]
    assert (len(prompts["train"]), len(prompts["dev"]), len(prompts["hidden"])) == (200, 100, 100)
    assert arithmetic_splits() == splits


def test_arithmetic_records_use_the_task_format() -> None:
    record = arithmetic_splits()["train"][0]
    a, b = (int(x) for x in record["prompt"].removeprefix("Q: ").removesuffix("\nA:").split("+"))
    assert record == {"prompt": f"Q: {a}+{b}\nA:", "completion": f" #### {a + b}"}


def test_artifact_dev_checks_are_a_subset_of_the_hidden_checks() -> None:
    checks = artifact_checks()
    dev = {(c["key"], c["expected"]) for c in checks["dev"]}
    hidden = {(c["key"], c["expected"]) for c in checks["hidden"]}
    assert dev < hidden
