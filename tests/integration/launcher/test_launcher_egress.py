"""The launcher's egress check (pods backend), with real sockets on this machine: a listening
address fails the job closed (exit 4) before any job code runs; closed addresses let it start."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import Launch, requires_root

pytestmark = requires_root

TOUCH = "import os\nopen(os.environ['POSTTRAIN_OUTPUT_DIR'] + '/ran', 'w').write('yes')\n"


@pytest.fixture
def listener() -> Iterator[int]:
    """A TCP port on 127.0.0.1 that accepts connections: an 'open' address."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(16)
        yield int(sock.getsockname()[1])


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # nothing listens once the socket is closed


def _egress_env(probes: list[dict[str, object]], report: Path, bound: float = 2) -> dict[str, str]:
    return {
        "POSTTRAIN_EGRESS_PROBES": json.dumps(probes),
        "POSTTRAIN_EGRESS_BOUND_SECONDS": str(bound),
        "POSTTRAIN_EGRESS_REPORT": str(report),
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(_closed_port()),
    }


def test_an_open_address_fails_the_job_closed_before_its_code_runs(
    launch: Launch, listener: int, tmp_path: Path
) -> None:
    report = tmp_path / "termination-log"
    probes = [{"name": "canary", "host": "127.0.0.1", "port": listener}]
    job = launch(TOUCH, extra_env=_egress_env(probes, report))
    assert job.returncode == 4, job.stderr
    # This machine's own resolver may be open too; the canary must be named either way.
    written = json.loads(report.read_text())
    assert written["egressVerified"] is False and written["rounds"] >= 2, written
    assert f"canary (tcp 127.0.0.1:{listener})" in written["open"], written
    reason = written["reason"]
    assert reason.startswith("egress open to ") and reason.endswith("; no job code ran"), reason
    assert f"error: {reason}" in job.stderr
    assert not (job.output_dir / "ran").exists()


def test_all_closed_lets_the_job_run_and_reports_what_was_probed(launch: Launch, tmp_path: Path) -> None:
    report = tmp_path / "termination-log"
    probes = [{"name": "gateway", "host": "127.0.0.1", "port": _closed_port()}]
    # In a network namespace of its own (no route anywhere), as a job pod under a working policy.
    job = launch(TOUCH, extra_env=_egress_env(probes, report), wrap=["unshare", "--net", "--"])
    assert job.returncode == 0, job.stderr
    assert (job.output_dir / "ran").read_text() == "yes"
    written = json.loads(report.read_text())
    assert written["egressVerified"] is True and written["open"] == [], written
    assert written["probes"] >= 2 and written["rounds"] == 1
    assert "egress verified" in job.stderr


def test_a_malformed_probe_list_refuses_the_job(launch: Launch, tmp_path: Path) -> None:
    env = _egress_env([], tmp_path / "report")
    env["POSTTRAIN_EGRESS_PROBES"] = '[{"host": "10.0.0.1"}]'
    job = launch(TOUCH, extra_env=env)
    assert job.returncode == 2, job.stderr
    assert "POSTTRAIN_EGRESS_PROBES is not a valid probe list" in job.stderr
    assert not (job.output_dir / "ran").exists()
