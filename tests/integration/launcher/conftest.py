"""Launch real jobs: the launcher as a subprocess, as root, exactly as a backend starts it.

No cluster is involved. Job scripts live in `jobs/`; each writes what it observed to
`$POSTTRAIN_OUTPUT_DIR/result.json`, which the tests assert on.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.launcher.support import Launch, launch_job, make_job_root


@pytest.fixture
def job_root() -> Iterator[Path]:
    root = make_job_root()
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def launch(job_python: str, job_root: Path) -> Launch:
    """`launch(script, packages=..., limits=..., extra_env=...)` -> Launched."""
    return functools.partial(launch_job, job_python, job_root)
