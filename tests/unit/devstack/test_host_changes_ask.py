"""What `make test` changes on this machine (system packages, Docker's default runtime, directory
permissions) it changes only when told to (POSTTRAIN_ASSUME_YES=1, `make test YES=1`) or when the
person at the terminal says yes; with neither, it stops and says what it would have done."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from devstack import preflight

REPO = Path(__file__).resolve().parents[3]
SETUP = REPO / "devstack" / "kind" / "host" / "docker-setup.sh"


def _confirm(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """The script's own say/die/confirm functions, run with no terminal on stdin."""
    text = SETUP.read_text()
    # One-line functions (say, die) end on their line; the others at the first "}" line.
    functions = [re.search(rf"^{name}\(\) \{{[^\n]*\}}$|^{name}\(\) \{{\n.*?^\}}$", text, re.S | re.M)
                 for name in ("say", "die", "confirm")]  # fmt: skip
    assert all(functions), "docker-setup.sh defines say, die and confirm"
    script = "\n".join(m.group(0) for m in functions if m) + '\nconfirm "install the system packages jq"\n'
    return subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script],
        stdin=subprocess.DEVNULL, capture_output=True, text=True, env={"PATH": os.environ["PATH"], **env},
        timeout=30,
    )  # fmt: skip


def test_docker_setup_stops_without_a_yes_and_goes_on_when_told() -> None:
    refused = _confirm({})
    assert refused.returncode == 1
    assert "install the system packages jq" in refused.stderr and "POSTTRAIN_ASSUME_YES=1" in refused.stderr
    told = _confirm({"POSTTRAIN_ASSUME_YES": "1"})
    assert told.returncode == 0, told.stderr


def test_docker_setup_asks_before_each_change_it_makes() -> None:
    text = SETUP.read_text()
    apt = text.index("apt-get install -y")
    runtime = text.index('echo "$wanted" > "$DAEMON_JSON"')
    assert text.rfind("confirm ", 0, apt) > text.index("install_packages() {")
    assert text.rfind("confirm ", 0, runtime) > text.index("install_runtime_wrapper() {")


def test_the_preflight_changes_permissions_only_when_told(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("POSTTRAIN_ASSUME_YES", raising=False)
    monkeypatch.delenv("CI", raising=False)
    assert not preflight.may_change("chmod o+x /nowhere")  # pytest's stdin is no terminal
    monkeypatch.setenv("POSTTRAIN_ASSUME_YES", "1")
    assert preflight.may_change("chmod o+x /nowhere")


def test_make_test_yes_and_ci_tell_it_to() -> None:
    makefile = (REPO / "Makefile").read_text()
    assert re.search(r"ifeq \(\$\(YES\),1\)\nexport POSTTRAIN_ASSUME_YES := 1\nendif", makefile)
    assert "make test YES=1" in (REPO / ".ci" / "run").read_text()
    dry = subprocess.run(["make", "-n", "-p", "YES=1", "help"], cwd=REPO, capture_output=True, text=True)
    assert "POSTTRAIN_ASSUME_YES := 1" in dry.stdout
