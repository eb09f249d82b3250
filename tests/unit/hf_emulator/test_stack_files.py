"""Each devstack stack has a data directory of its own, and its emulator token lives in a file."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from devstack import stack


def test_two_stacks_never_share_a_data_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    made = []
    try:
        for name in ("one", "two"):
            monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path / name))
            made.append(stack._data_dir())
        assert made[0] != made[1]
        monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path / "one"))
        assert stack._data_dir() == made[0]  # and each stack finds its own again
    finally:
        for path in made:
            path.rmdir()


def test_the_emulator_token_is_fresh_and_in_a_private_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path))
    first, path = stack._emulator_token()
    second, _ = stack._emulator_token()
    assert first != second and first.startswith("hf_")
    assert path.read_text() == second
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
