"""Grader jobs run by the real launcher (sandboxed, uid 10000, no network), as every backend runs them.

The launcher drops privileges, so it must start as root (as it does in a job); the job's uid must be
able to reach its inputs, so each test lays out a world-searchable POSTTRAIN_ROOT under /tmp.
"""

import json
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from posttrain_launcher import JobSpec, launcher_command, launcher_env

from graders.assets import materialize_assets
from graders.result import GraderResult, read_result
from graders.tasks import DATASET_FILE, RepoRef, Task, get_task

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0, reason="the launcher starts as root and drops to the job uid, as in a real job"
)
REPO_ROOT = Path(__file__).resolve().parents[3]
ARITHMETIC = get_task("t0_arithmetic_format")
ARTIFACT = get_task("t0_artifact")


@pytest.fixture(scope="module")
def repos() -> dict[RepoRef, Path]:
    return {repo.ref: repo.path for repo in materialize_assets()}


@pytest.fixture
def job_root() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="posttrain-grader-root-"))
    root.chmod(0o755)
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def place_input(root: Path, name: str, source: Path) -> str:
    """Copy an input into the job tree, root-owned and read-only for the job (as a mount would be)."""
    target = root / "inputs" / name
    shutil.copytree(source, target)
    for directory in [root / "inputs", *(p for p in target.rglob("*") if p.is_dir()), target]:
        directory.chmod(0o755)
    for file in (p for p in target.rglob("*") if p.is_file()):
        file.chmod(0o644)
    return f"/inputs/{name}"


def run_grader_job(python: str, root: Path, task: Task, inputs: dict[str, Path]) -> GraderResult:
    spec = JobSpec(
        role="grader",
        script=task.grader_script(),
        packages=[],
        inputs={name: place_input(root, name, path) for name, path in inputs.items()},
        output_dir="/outputs",
    )
    flavor = {"MEMORY": "16Gi", "CPU_CORES": "2"}  # as every backend states it (cpu-basic)
    env = launcher_env(spec, root=str(root), base={**os.environ, **flavor, "PYTHONPATH": str(REPO_ROOT)})
    proc = subprocess.run(
        launcher_command(python), env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "score" not in (proc.stdout + proc.stderr).lower()
    return read_result(root / "outputs")


@pytest.mark.parametrize(("off_by", "want"), [(0, 1.0), (1, 0.0)], ids=["right", "wrong"])
def test_artifact_grader_job_scores_the_artifact(
    job_python: str, repos: dict[RepoRef, Path], job_root: Path, tmp_path: Path, off_by: int, want: float
) -> None:
    sums: dict[str, int] = {}
    for line in (repos[ARTIFACT.agent_datasets["records"]] / DATASET_FILE).read_text().splitlines():
        record = json.loads(line)
        sums[record["key"]] = sums.get(record["key"], 0) + record["value"]
    outputs = tmp_path / "job-outputs"
    outputs.mkdir()
    (outputs / "answer.json").write_text(json.dumps({**sums, "k00": sums["k00"] + off_by}))
    inputs = {"checkpoint": outputs, "split": repos[ARTIFACT.hidden_split]}
    result = run_grader_job(job_python, job_root, ARTIFACT, inputs)
    assert (result.status, result.score) == ("ok", want)


def test_arithmetic_grader_job_loads_and_scores_the_base_in_the_sandbox(
    job_python: str, repos: dict[RepoRef, Path], job_root: Path
) -> None:
    assert ARITHMETIC.base_model is not None
    base = repos[ARITHMETIC.base_model]
    inputs = {"base_model": base, "checkpoint": base, "split": repos[ARITHMETIC.hidden_split]}
    result = run_grader_job(job_python, job_root, ARITHMETIC, inputs)
    assert (result.status, result.n) == ("ok", 100)
    assert result.score <= 0.1
