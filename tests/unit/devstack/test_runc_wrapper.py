"""The runc wrapper that lets privileged containers start on kernels without CAP_SYS_RESOURCE: it
must strip that one capability from every set, on create/run and on exec, and pass everything else
through to the real runc unchanged."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

WRAPPER = Path(__file__).resolve().parents[3] / "devstack" / "kind" / "host" / "runc-without-sys-resource"
CAPS = ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_NET_ADMIN"]
SETS = ("bounding", "effective", "inheritable", "permitted", "ambient")

pytestmark = pytest.mark.skipif(shutil.which("jq") is None, reason="jq is installed by `make docker-host`")


@pytest.fixture
def fake_runc(tmp_path: Path) -> Path:
    """Stands in for runc: records its arguments, so the test sees what the wrapper passed on."""
    script = tmp_path / "runc"
    script.write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" > {tmp_path / "args"}\n')
    script.chmod(0o755)
    return script


def run_wrapper(fake_runc: Path, *args: str) -> list[str]:
    env = dict(os.environ, POSTTRAIN_REAL_RUNC=str(fake_runc))
    subprocess.run([str(WRAPPER), *args], env=env, check=True, timeout=30)
    return (fake_runc.parent / "args").read_text().splitlines()


def spec(tmp_path: Path) -> dict[str, object]:
    return {
        "ociVersion": "1.0.2",
        "process": {"args": ["sh"], "capabilities": {name: list(CAPS) for name in SETS}},
        "mounts": [{"destination": "/proc", "type": "proc"}],
    }


@pytest.mark.parametrize("command", ["create", "run"])
def test_create_and_run_drop_sys_resource_from_every_set(
    tmp_path: Path, fake_runc: Path, command: str
) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps(spec(tmp_path)))
    args = [
        "--root",
        "/run/x",
        "--log",
        str(tmp_path / "runc.log"),
        "--systemd-cgroup",
        command,
        "--bundle",
        str(bundle),
        "ctr1",
    ]
    assert run_wrapper(fake_runc, *args) == args
    config = json.loads((bundle / "config.json").read_text())
    for name in SETS:
        assert config["process"]["capabilities"][name] == ["CAP_CHOWN", "CAP_NET_ADMIN"]
    assert config["mounts"] == spec(tmp_path)["mounts"]


def test_exec_drops_sys_resource_from_the_process_spec(tmp_path: Path, fake_runc: Path) -> None:
    process = tmp_path / "process.json"
    process.write_text(json.dumps({"args": ["ls"], "capabilities": {name: list(CAPS) for name in SETS}}))
    run_wrapper(fake_runc, "--root", "/run/x", "exec", "--process", str(process), "--detach", "ctr1")
    caps = json.loads(process.read_text())["capabilities"]
    assert all(caps[name] == ["CAP_CHOWN", "CAP_NET_ADMIN"] for name in SETS)


def test_other_commands_pass_through_and_touch_nothing(tmp_path: Path, fake_runc: Path) -> None:
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    original = json.dumps(spec(tmp_path))
    (bundle / "config.json").write_text(original)
    assert run_wrapper(fake_runc, "--root", "/run/x", "delete", "--force", "ctr1") == [
        "--root", "/run/x", "delete", "--force", "ctr1",
    ]  # fmt: skip
    assert (bundle / "config.json").read_text() == original
