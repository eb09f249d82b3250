"""A score job's evidence of what ran: the launcher's copy of each script the submission was built by,
vouched for by the hash the operator passes; a copy removed, altered or made a link is not."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from posttrain_launcher.launcher import SCRIPT_COPY_NAME as LAUNCHERS_NAME

from graders.inputs import GraderInputs
from graders.integrity.checks import SCRIPT_COPY_NAME, script_sources


def _outputs(tmp_path: Path, job: str, script: str | None) -> Path:
    root = tmp_path / job
    root.mkdir()
    if script is not None:
        (root / SCRIPT_COPY_NAME).write_text(script)
    return root


def _sha(script: str) -> str:
    return hashlib.sha256(script.encode()).hexdigest()


def test_the_grader_reads_the_copy_the_launcher_writes() -> None:
    assert SCRIPT_COPY_NAME == LAUNCHERS_NAME


def test_copies_matching_their_hash_are_sources_and_the_others_are_unaccounted(tmp_path: Path) -> None:
    final = _outputs(tmp_path, "final", "print('final')")
    kept = _outputs(tmp_path, "kept", "print('kept')")
    removed = _outputs(tmp_path, "removed", None)
    altered = _outputs(tmp_path, "altered", "print('clean, honest')")
    linked = _outputs(tmp_path, "linked", None)
    (linked / SCRIPT_COPY_NAME).symlink_to(kept / SCRIPT_COPY_NAME)
    inputs = GraderInputs(
        checkpoint=final,
        split=tmp_path,
        base_model=None,
        lineage=(("kept", kept), ("removed", removed), ("altered", altered), ("linked", linked)),
        scripts=(
            ("final", _sha("print('final')")),
            ("kept", _sha("print('kept')")),
            ("removed", _sha("print('removed')")),
            ("altered", _sha("print('HIDDEN ITEMS')")),
            ("linked", _sha("print('kept')")),
        ),
    )
    sources, unaccounted = script_sources(inputs)
    assert sources == [("script:final", "print('final')"), ("script:kept", "print('kept')")]
    assert unaccounted == ["removed", "altered", "linked"]


def test_a_lineage_job_the_platform_did_not_mount_is_the_platforms_failure(tmp_path: Path) -> None:
    final = _outputs(tmp_path, "final", "x")
    inputs = GraderInputs(
        checkpoint=final, split=tmp_path, base_model=None, scripts=(("final", _sha("x")), ("gone", _sha("y")))
    )
    with pytest.raises(RuntimeError, match="not mounted"):
        script_sources(inputs)
