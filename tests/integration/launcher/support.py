"""Launcher test helpers: job scripts from `jobs/`, and the launcher started as a backend starts it."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from posttrain_launcher import JobSpec, Limits, launcher_command, launcher_env

JOBS = Path(__file__).parent / "jobs"


# What every backend tells the container about its flavor (here cpu-basic), as HF Jobs does.
FLAVOR_ENV = {"MEMORY": "16Gi", "CPU_CORES": "2"}


# A network namespace of its own holding lo alone, up: what a backend gives a loopback job.
LOOPBACK_ONLY = ("unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh")


# The launcher as a job pod starts it: uid 10000, no capability, no_new_privs (it then makes the
# job's user and network namespace itself).
AS_POD = ("setpriv", "--reuid=10000", "--regid=10000", "--clear-groups", "--inh-caps=-all", "--no-new-privs")


requires_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="the sandbox tests launch as root, as a real job does (drop to uid 10000)"
)


@dataclasses.dataclass
class Launched:
    returncode: int
    stdout: str
    stderr: str
    output_dir: Path

    def result(self) -> dict[str, Any]:
        path = self.output_dir / "result.json"
        assert path.exists(), f"the job wrote no result.json; rc={self.returncode} stderr:\n{self.stderr}"
        data: dict[str, Any] = json.loads(path.read_text())
        return data


def fill(template: str, **subst: object) -> str:
    """A job script template with each `@@KEY@@` replaced."""
    for key, value in subst.items():
        template = template.replace(f"@@{key}@@", str(value))
    return template


def job_script(name: str, **subst: object) -> str:
    return fill((JOBS / name).read_text(), **subst)


def make_job_root() -> Path:
    """A POSTTRAIN_ROOT that uid 10000 can search, with a root-owned read-only input tree.

    Not under pytest's tmp_path: that is private to root, and the job must reach its outputs.
    """
    root = Path(tempfile.mkdtemp(prefix="posttrain-job-root-"))
    root.chmod(0o755)
    model = root / "inputs" / "model"
    model.mkdir(parents=True)
    (model / "weights.bin").write_bytes(b"\x00" * 64)
    (model / "config.json").write_text("{}")
    return root


def launch_job(
    python: str,
    root: Path,
    script: str,
    *,
    packages: list[str] | None = None,
    limits: Limits | None = None,
    extra_env: Mapping[str, str] | None = None,
    spec_json: str | None = None,
    timeout: float = 180,
    role: str = "agent",
    flavor: Mapping[str, str] = FLAVOR_ENV,
    wrap: Sequence[str] = (),
    network: str = "unix",
) -> Launched:
    """`wrap`: a command the launcher runs under (e.g. `unshare -n`, or LOOPBACK_ONLY)."""
    spec = JobSpec(
        role=role,
        script=script,
        packages=packages or [],
        inputs={"model": "/inputs/model"},
        output_dir="/outputs",
        limits=limits or Limits(),
        network=network,
    )
    base = {k: v for k, v in os.environ.items() if k not in FLAVOR_ENV}
    env = launcher_env(spec, root=str(root), base={**base, **flavor, **(extra_env or {})})
    if spec_json is not None:
        env["POSTTRAIN_JOB_SPEC"] = spec_json
    proc = subprocess.run(
        [*wrap, *launcher_command(python)],
        env=env,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    return Launched(proc.returncode, proc.stdout, proc.stderr, root / "outputs")


Launch = Callable[..., Launched]
