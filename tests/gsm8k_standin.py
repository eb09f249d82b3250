"""The `gsm8k` task on its stand-in, as the integration and e2e suites run it: the plugin's settings,
and the task registry read with them (the tests' own process resolves repos and builds assets)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from graders import tasks

SETTINGS = {
    "POSTTRAIN_TASK_GSM8K_STANDIN": "true",
    "POSTTRAIN_TASK_GSM8K_FLAVOR": "cpu-upgrade",  # the stand-in runs on CPU; the real task on h200
    "POSTTRAIN_TASK_GSM8K_MAX_JOB_TIMEOUT_SECONDS": "3600",
    "POSTTRAIN_TASK_GSM8K_DEV_EVALUATIONS": "2",  # the cap's test reaches it in a few calls
}


@contextlib.contextmanager
def standin_registry() -> Iterator[None]:
    """This process's task registry with the stand-in's settings, and as it was afterwards."""
    saved = {name: os.environ.get(name) for name in SETTINGS}
    os.environ.update(SETTINGS)
    tasks._registry.cache_clear()
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        tasks._registry.cache_clear()
