"""Process and memory bounds from the flavor, and grader jobs that nothing of another job can shadow."""

from __future__ import annotations

from pathlib import Path

from posttrain_launcher import Limits
from posttrain_launcher.bounds import PROCESSES_PER_CPU

from tests.integration.hostile_jobs import RESERVE_TWICE_THE_MEMORY

from .support import Launch, fill, requires_root

pytestmark = requires_root

WRITE_RESULT = "json.dump(r, open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'result.json'), 'w'))\n"
RLIMITS = (
    "import json, os, resource\n"
    "r = {name: resource.getrlimit(getattr(resource, name)) for name in ('RLIMIT_NPROC', 'RLIMIT_DATA')}\n"
    + WRITE_RESULT
)


def test_the_flavor_sets_the_process_and_memory_limits(launch: Launch) -> None:
    job = launch(RLIMITS)  # MEMORY=16Gi, CPU_CORES=2, as a backend states cpu-basic
    assert job.returncode == 0, job.stderr
    assert job.result() == {
        "RLIMIT_NPROC": [2 * PROCESSES_PER_CPU] * 2,
        "RLIMIT_DATA": [16 << 30] * 2,
    }
    assert "posttrain-launcher: memory: 17179869184 bytes, held by" in job.stderr


def test_the_spec_lowers_them(launch: Launch) -> None:
    job = launch(RLIMITS, limits=Limits(max_processes=64, max_memory_bytes=1 << 30))
    assert job.returncode == 0, job.stderr
    assert job.result() == {"RLIMIT_NPROC": [64, 64], "RLIMIT_DATA": [1 << 30, 1 << 30]}


def test_torch_works_under_the_smallest_pod_flavor(launch: Launch) -> None:
    """The memory bound is on what a process allocates, not its address space: torch's libraries
    alone reserve more than 2 GiB of it."""
    script = "import torch, transformers\nprint(float((torch.ones(64, 64) @ torch.ones(64, 64)).sum()))\n"
    job = launch(script, flavor={"MEMORY": "2Gi", "CPU_CORES": "1"})
    assert job.returncode == 0, job.stderr
    assert job.stdout.strip() == str(64.0**3)


def test_without_a_flavor_the_launcher_refuses_before_any_job_code(launch: Launch, job_root: Path) -> None:
    script = "import os\nopen(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'ran'), 'w').close()\n"
    job = launch(script, flavor={})
    assert job.returncode == 2
    assert "posttrain-launcher: error: no memory bound: MEMORY" in job.stderr
    assert not (job_root / "outputs" / "ran").exists()


def test_a_malformed_flavor_is_refused(launch: Launch) -> None:
    job = launch("print(1)", flavor={"MEMORY": "16 GB", "CPU_CORES": "2"})
    assert job.returncode == 2
    assert "MEMORY='16 GB' is not a memory quantity" in job.stderr


def test_a_memory_bomb_fails_the_job_with_memory_error(launch: Launch) -> None:
    bomb = "hoard = []\nwhile True:\n    hoard.append(bytearray(16 << 20))\n"
    job = launch(bomb, limits=Limits(max_memory_bytes=256 << 20))
    assert job.returncode == 1
    assert "MemoryError" in job.stderr


def test_a_fork_bomb_stops_at_the_process_limit(launch: Launch) -> None:
    """RLIMIT_NPROC counts every process and thread of uid 10000 in its user namespace; here (no
    namespace of its own) that includes any other job of that uid on the host, so only the upper
    bound is certain."""
    bomb = (
        "import errno, json, os, signal\n"
        "children, r = [], {}\n"
        "while len(children) < 1000:\n"
        "    try:\n"
        "        pid = os.fork()\n"
        "    except OSError as exc:\n"
        "        r['error'] = errno.errorcode[exc.errno]\n"
        "        break\n"
        "    if pid == 0:\n"
        "        signal.pause()\n"
        "        os._exit(0)\n"
        "    children.append(pid)\n"
        "r['forked'] = len(children)\n"
        "for pid in children:\n"
        "    os.kill(pid, signal.SIGKILL)\n"
        "    os.waitpid(pid, 0)\n" + WRITE_RESULT
    )
    job = launch(bomb, limits=Limits(max_processes=128))
    assert job.returncode == 0, job.stderr
    result = job.result()
    assert result["error"] == "EAGAIN"
    assert result["forked"] < 128


GRADER_PATHS = """
import importlib.util, json, os, stat, sys
import graders.run, graders.artifact, graders.arithmetic_format  # what a grader job imports
r = {
    "sys_path": sys.path,
    "writable_on_sys_path": [p for p in sys.path if p and os.path.isdir(p) and os.access(p, os.W_OK)],
    "cwd": os.getcwd(),
    "cwd_writable": os.access(os.getcwd(), os.W_OK),
    "script_dir_on_path": os.path.dirname(os.path.abspath(sys.argv[0])) in sys.path,
    "run_module_owner": os.stat(importlib.util.find_spec("graders.run").origin).st_uid,
    "tmp_mode": stat.S_IMODE(os.stat(os.environ["TMPDIR"]).st_mode),
}
"""


def test_a_grader_job_has_nothing_agent_writable_on_its_path_or_as_its_cwd(launch: Launch) -> None:
    job = launch(GRADER_PATHS + WRITE_RESULT, role="grader")
    assert job.returncode == 0, job.stderr
    result = job.result()
    assert result["writable_on_sys_path"] == []
    assert "" not in result["sys_path"]
    assert result["script_dir_on_path"] is False
    assert result["cwd_writable"] is False
    assert result["run_module_owner"] == 0
    assert result["tmp_mode"] == 0o700


def test_without_a_cgroup_holding_the_job_a_reservation_past_its_bound_is_refused(launch: Launch) -> None:
    """Here no backend says a cgroup of the job's own holds it, so RLIMIT_DATA does, on what a process
    maps writable: the reservation the emulator's job cgroup allows (test_job_isolation) fails."""
    script = fill(RESERVE_TWICE_THE_MEMORY, MEMORY=512 << 20)
    job = launch(script, flavor={"MEMORY": "512Mi", "CPU_CORES": "1"})
    assert job.returncode == 1, job.stderr
    assert "OSError: [Errno 12] Cannot allocate memory" in job.stderr
    assert "held by RLIMIT_DATA per process" in job.stderr
