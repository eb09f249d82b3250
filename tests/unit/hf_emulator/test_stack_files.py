"""Each devstack stack has a data directory of its own, and its emulator token lives in a file."""

from __future__ import annotations

import json
import os
import stat
from dataclasses import asdict
from pathlib import Path

import pytest

from devstack import stack
from devstack.controlplane.cluster import ClusterError


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


def _record_stack(run_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A stack's state as `up` leaves it (no process running), with a file in its data directory."""
    monkeypatch.setenv("DEVSTACK_RUN_DIR", str(run_dir))
    run_dir.mkdir()
    data_dir = stack._data_dir()
    (data_dir / "hf").mkdir()
    (data_dir / "hf" / "job-output").write_text(run_dir.name)
    state = stack.StackState("", "", "", "", "", str(data_dir), pids={})
    (run_dir / "stack.json").write_text(json.dumps(asdict(state)))
    return data_dir


def test_one_stack_down_leaves_the_other_stacks_data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = _record_stack(tmp_path / "mine", monkeypatch)
    other = _record_stack(tmp_path / "other", monkeypatch)
    try:
        monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path / "mine"))
        stack.down(keep_cluster=True)
        assert not mine.exists()
        assert (other / "hf" / "job-output").read_text() == "other"
    finally:
        stack.remove_tree(mine)
        stack.remove_tree(other)


def test_a_link_planted_where_the_data_directory_goes_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path / "run"))
    path = stack._data_dir()
    path.rmdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    path.symlink_to(elsewhere)
    try:
        with pytest.raises(ClusterError, match="is not a directory of uid"):
            stack._data_dir()
        assert stat.S_IMODE(elsewhere.stat().st_mode) == 0o700  # its target left alone
    finally:
        path.unlink()


@pytest.mark.skipif(os.geteuid() != 0, reason="making a directory another user owns needs root")
def test_a_data_directory_another_user_made_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path / "run"))
    path = stack._data_dir()
    os.chown(path, os.getuid() + 1, -1)
    try:
        with pytest.raises(ClusterError, match="is not a directory of uid"):
            stack._data_dir()
    finally:
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


def test_the_emulator_command_line_names_the_token_file_and_never_holds_the_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DEVSTACK_RUN_DIR", str(tmp_path))
    token, path = stack._emulator_token()
    argv = stack.emulator_argv(8080, tmp_path / "data", path, [])
    assert f"--token-file={path}" in argv
    assert not any(token in arg for arg in argv)


def test_make_up_takes_the_charts_identities_rbac_and_admission_and_nothing_else() -> None:
    helm = stack.bin_dir() / "helm"
    if not helm.exists():
        pytest.skip(f"no helm binary at {helm}: run `make binaries`")
    objects = stack.chart_cluster_objects()
    kinds = {d["kind"] for d in objects}
    assert kinds <= stack.CLUSTER_LEVEL_KINDS
    assert {"ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ClusterRole", "Role"} <= kinds
    names = {(d["kind"], d["metadata"]["name"]) for d in objects}
    assert ("ServiceAccount", stack.OPERATOR_SA) in names and ("ServiceAccount", stack.GATEWAY_SA) in names
    assert not any("helm.sh/hook" in (d["metadata"].get("annotations") or {}) for d in objects)
    # The operator's Role is where the local operator watches.
    roles = [d for d in objects if d["kind"] == "Role" and d["metadata"]["name"] == stack.OPERATOR_SA]
    assert [r["metadata"]["namespace"] for r in roles] == [stack.DEMO_NAMESPACE]
