"""A task's job limits: bounded, consistent, and carried into the launcher's spec unchanged."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from graders.job_limits import SMALL_AGENT_JOB, JobLimitMaxima, JobLimits


def test_a_file_larger_than_the_whole_output_tree_is_refused() -> None:
    fields = SMALL_AGENT_JOB.model_dump() | {"max_file_bytes": SMALL_AGENT_JOB.max_output_bytes + 1}
    with pytest.raises(ValidationError, match=r"max_file_bytes .* exceeds max_output_bytes"):
        JobLimits(**fields)


def test_the_launcher_gets_every_limit_the_scratch_as_its_max_scratch_bytes() -> None:
    from posttrain_launcher.spec import Limits

    launcher = Limits(**SMALL_AGENT_JOB.launcher_limits())
    assert launcher.file_bytes == SMALL_AGENT_JOB.max_file_bytes
    assert launcher.max_log_file_bytes == SMALL_AGENT_JOB.max_log_file_bytes
    assert launcher.max_scratch_bytes == SMALL_AGENT_JOB.scratch_bytes


def test_maxima_list_each_limit_over_them_and_nothing_else() -> None:
    maxima = JobLimitMaxima(max_output_bytes=1 << 30, scratch_bytes=1 << 30)
    assert maxima.excess(SMALL_AGENT_JOB) == [
        f"max_output_bytes {2 << 30} > the platform's {1 << 30}",
        f"scratch_bytes {10 << 30} > the platform's {1 << 30}",
    ]
    assert JobLimitMaxima().excess(SMALL_AGENT_JOB) == []
