"""Isolation inside a launched job (docs/sandboxing.md). One probe job, one assertion per test.

`test_control_*` runs the same probe without the launcher and shows the probes do detect a
reachable network, so the sandboxed results are not vacuous.
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from posttrain_launcher import Limits

from .support import job_script, launch_job, make_job_root, requires_root

pytestmark = requires_root

CAP = 64 * 1024
SECRETS = {
    "HF_TOKEN": "hf_sentinel_token_value_1",
    "HUGGING_FACE_HUB_TOKEN": "hf_sentinel_token_value_2",
    "AWS_SECRET_ACCESS_KEY": "aws_sentinel_secret_3",
    "AWS_ACCESS_KEY_ID": "AKIASENTINEL4",
    "GITHUB_TOKEN": "ghp_sentinel_5",
    "OPENAI_API_KEY": "sk-sentinel-6",
    "DB_PASSWORD": "sentinel_password_7",
    "GOOGLE_APPLICATION_CREDENTIALS": "/sentinel/creds8.json",
    "DATABASE_URL": "postgres://user:sentinel_pw_9@db.internal/x",
    "my_lowercase_secret": "sentinel_lower_10",
}
SECRET_NAME = re.compile(r"token|secret|key|passw|credential", re.IGNORECASE)


@pytest.fixture(scope="module")
def listener() -> Iterator[socket.socket]:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)
    sock.setblocking(False)
    yield sock
    sock.close()


@pytest.fixture(scope="module")
def probe(job_python: str, listener: socket.socket) -> Iterator[dict[str, Any]]:
    """One launch serves every assertion below."""
    root = make_job_root()
    try:
        script = job_script("isolation_probe.py", PORT=listener.getsockname()[1], CAP=CAP)
        job = launch_job(job_python, root, script, limits=Limits(max_output_bytes=CAP), extra_env=SECRETS)
        assert job.returncode == 0, job.stderr
        data = job.result()
        data["_input_files"] = sorted(p.name for p in (root / "inputs" / "model").iterdir())
        yield data
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("family", ["AF_INET", "AF_INET6", "AF_NETLINK", "AF_PACKET", "AF_VSOCK"])
def test_non_unix_socket_families_get_eacces(probe: dict[str, Any], family: str) -> None:
    assert probe["sockets"][family] == "EACCES"


def test_socketpair_of_another_family_gets_eacces(probe: dict[str, Any]) -> None:
    assert probe["socketpair_inet"] == "EACCES"


def test_raw_socket_syscall_through_ctypes_gets_eacces(probe: dict[str, Any]) -> None:
    assert probe["raw_socket_syscall"] == "EACCES"


def test_io_uring_setup_is_refused(probe: dict[str, Any]) -> None:
    assert probe["io_uring_setup"] in ("EACCES", "ENOSYS")


@pytest.mark.skipif(platform.machine() != "x86_64", reason="i386/x32 machine code is x86_64 only")
@pytest.mark.parametrize("abi", ["i386_socketcall", "x32_socket"])
def test_foreign_abi_syscall_is_killed(probe: dict[str, Any], abi: str) -> None:
    # SIGSYS from the filter's bad-architecture action; EACCES (-13) would also be a refusal.
    outcome = probe[abi]
    assert outcome["returncode"] == -signal.SIGSYS or outcome["value"] == "-13", outcome


def test_dns_lookups_fail(probe: dict[str, Any]) -> None:
    assert all(v != "ok" for v in probe["dns"].values()), probe["dns"]


def test_connection_to_a_loopback_listener_fails(probe: dict[str, Any], listener: socket.socket) -> None:
    assert probe["connect_loopback"] == "EACCES"
    with pytest.raises(BlockingIOError):
        listener.accept()


def test_no_credential_like_variable_reaches_the_job(probe: dict[str, Any]) -> None:
    leaked = [name for name in probe["env"] if SECRET_NAME.search(name)]
    assert leaked == []
    dump = json.dumps(probe["env"]) + probe["proc_self_environ"]
    assert [v for v in SECRETS.values() if v in dump] == []
    assert "POSTTRAIN_JOB_SPEC" not in probe["env"]


def test_job_runs_as_uid_10000_without_capabilities_under_seccomp(probe: dict[str, Any]) -> None:
    status = probe["status"]
    assert status["Uid"].split() == ["10000"] * 4
    assert status["Gid"].split() == ["10000"] * 4
    assert status["Groups"] == ""
    assert int(status["CapEff"], 16) == 0
    assert int(status["CapPrm"], 16) == 0
    assert status["NoNewPrivs"] == "1"
    assert status["Seccomp"] == "2"


def test_other_processes_environ_is_unreadable(probe: dict[str, Any]) -> None:
    assert probe["proc1_environ"] == "EACCES"
    assert probe["parent_environ"] == "EACCES"  # the launcher, which holds the unscrubbed env


def test_inputs_are_read_only(probe: dict[str, Any]) -> None:
    assert probe["inputs"] == {
        "append": "EACCES",
        "create": "EACCES",
        "unlink": "EACCES",
        "chmod": "EPERM",
        "read": "ok",
    }
    assert probe["_input_files"] == ["config.json", "weights.bin"]


def test_writing_past_the_per_file_output_cap_fails(probe: dict[str, Any]) -> None:
    assert probe["output_cap"] == {"to_cap": "ok", "past_cap": "EFBIG"}


def test_control_the_probe_sees_the_network_without_the_sandbox(
    listener: socket.socket, tmp_path: Path
) -> None:
    """The same probe, run directly as root: its checks do detect an open network."""
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "weights.bin").write_bytes(b"\x00")
    (tmp_path / "model" / "config.json").write_text("{}")
    env = {
        **os.environ,
        "POSTTRAIN_OUTPUT_DIR": str(tmp_path),
        "POSTTRAIN_INPUT_MODEL": str(tmp_path / "model"),
    }
    script = job_script("isolation_probe.py", PORT=listener.getsockname()[1], CAP=CAP)
    subprocess.run([sys.executable, "-c", script], env=env, check=True, timeout=120, capture_output=True)
    data = json.loads((tmp_path / "result.json").read_text())
    assert data["sockets"]["AF_INET"] == "ok"
    assert data["raw_socket_syscall"] == "ok"
    assert data["connect_loopback"] == "ok"
    listener.setblocking(True)
    listener.settimeout(5)
    conn, _ = listener.accept()
    conn.close()
    listener.setblocking(False)
    if platform.machine() == "x86_64":
        assert data["i386_socketcall"]["returncode"] == 0  # executed (EFAULT), not killed
