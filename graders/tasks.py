"""Task registry: the project's own tasks (`graders.builtin_tasks`) and any package's entry point in
the `posttrain.tasks` group, so a lab adds a task by installing its package (docs/tasks.md). What a task
is lives in `graders.task_model`; its names are re-exported here, the one module plugins import. The
operator and the gateway import this module, and neither depends on torch: keep it to the standard
library and pydantic. The grader programs (which may import torch) are named by module and imported
only in jobs.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import metadata

from graders.builtin_tasks import BUILTIN_TASKS
from graders.job_limits import JobLimitMaxima
from graders.task_model import (
    AGENT_INPUT_MODEL,
    DATASET_FILE,
    ENTRY_POINT_GROUP,
    ENVIRONMENT_NAME,
    GRADER_INPUT_BASE_MODEL,
    GRADER_INPUT_CHECKPOINT,
    GRADER_INPUT_SPLIT,
    LOCAL_ASSETS_REVISION,
    LOCAL_NAMESPACE,
    RESULT_FILE,
    AssetLocation,
    GraderPurpose,
    RepoRef,
    Task,
    TaskLimits,
    TaskPlugin,
    TaskPublicView,
    evidence_input_name,
    package_name,
    wheels_input_name,
)

__all__ = [
    "AGENT_INPUT_MODEL",
    "DATASET_FILE",
    "ENTRY_POINT_GROUP",
    "ENVIRONMENT_NAME",
    "GRADER_INPUT_BASE_MODEL",
    "GRADER_INPUT_CHECKPOINT",
    "GRADER_INPUT_SPLIT",
    "LOCAL_ASSETS_REVISION",
    "LOCAL_NAMESPACE",
    "RESULT_FILE",
    "AssetLocation",
    "GraderPurpose",
    "RegisteredTask",
    "RepoRef",
    "Task",
    "TaskLimits",
    "TaskPlugin",
    "TaskPublicView",
    "TaskRegistryError",
    "UnknownTaskError",
    "all_tasks",
    "evidence_input_name",
    "get_task",
    "package_name",
    "registered_task",
    "task_names",
    "wheels_input_name",
]


@dataclass(frozen=True)
class RegisteredTask:
    task: Task
    plugin: TaskPlugin
    source: str  # where it came from, for messages: "builtin" or the entry point


class TaskRegistryError(RuntimeError):
    """A plugin that cannot be loaded or clashes with another: the operator refuses to start."""


def _entry_point_plugins() -> list[tuple[str, str | None, TaskPlugin]]:
    """(source, the task name it must define, plugin) for each installed entry point."""
    found: list[tuple[str, str | None, TaskPlugin]] = []
    for entry in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        source = f"entry point {entry.name} = {entry.value}"
        try:
            plugin = entry.load()
        except Exception as exc:
            raise TaskRegistryError(f"{source}: {type(exc).__name__}: {exc}") from exc
        if not isinstance(plugin, TaskPlugin):
            raise TaskRegistryError(f"{source}: is a {type(plugin).__name__}, not a TaskPlugin")
        found.append((source, entry.name, plugin))
    return found


@functools.cache
def _registry() -> dict[str, RegisteredTask]:
    location = AssetLocation()
    maxima = JobLimitMaxima()
    candidates = [("builtin", None, plugin) for plugin in BUILTIN_TASKS] + _entry_point_plugins()
    tasks: dict[str, RegisteredTask] = {}
    for source, expected_name, plugin in candidates:
        try:
            defined = plugin.define(location)
            if not isinstance(defined, Task):
                raise TypeError(f"define() returned a {type(defined).__name__}, not a Task")
            task = Task.model_validate(defined.model_dump())  # again: model_copy() does not validate
        except Exception as exc:
            raise TaskRegistryError(f"{source}: {type(exc).__name__}: {exc}") from exc
        if expected_name is not None and task.name != expected_name:
            raise TaskRegistryError(f"{source}: defines task {task.name!r}; name the entry point after it")
        excess = [
            f"{role} job {what}"
            for role, limits in (("agent", task.agent_job_limits), ("grader", task.grader_job_limits))
            for what in maxima.excess(limits)
        ]
        if excess:
            raise TaskRegistryError(
                f"{source}: task {task.name!r} asks for more than the platform allows: {'; '.join(excess)}"
            )
        if task.name in tasks:
            raise TaskRegistryError(
                f"{source}: task {task.name!r} is already registered by {tasks[task.name].source}"
            )
        tasks[task.name] = RegisteredTask(task=task, plugin=plugin, source=source)
    return tasks


class UnknownTaskError(KeyError):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        return f"unknown task {self.name!r}; known tasks: {', '.join(task_names())}"


def task_names() -> list[str]:
    return sorted(_registry())


def get_task(name: str) -> Task:
    return registered_task(name).task


def all_tasks() -> list[Task]:
    return [registered_task(name).task for name in task_names()]


def registered_task(name: str) -> RegisteredTask:
    try:
        return _registry()[name]
    except KeyError:
        raise UnknownTaskError(name) from None
