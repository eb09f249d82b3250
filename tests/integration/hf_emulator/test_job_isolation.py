"""Jobs cannot touch each other or the host: real launcher jobs attack through the emulator.

Each attack runs as an agent would run it (`python -m posttrain_launcher`, dropping to uid 10000),
with the emulator as root, and each test also shows the thing it attacks is real (the daemon ran,
the socket answers the host, the hidden split sits on the host), so a pass is not vacuous.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub import HfApi, HfFileSystem, Volume

from devstack.hf_emulator import HfEmulator
from devstack.hf_emulator.repos import remove_tree
from devstack.sandbox.isolation import python_binds
from graders.assets.datasets import write_dataset_repo
from graders.tasks import get_task
from tests.helpers import wait_for
from tests.integration.hostile_jobs import FORK_BOMB, MEMORY_BOMB, RESERVE_TWICE_THE_MEMORY
from tests.integration.launcher.support import fill

from .test_jobs_api import IMAGE, host_pids_with, sleeper, wait_for_processes, wait_terminal

launcher = pytest.importorskip("posttrain_launcher")

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="jobs are isolated only when the emulator is root")

JOBS = Path(__file__).parent / "jobs"
REPO_ROOT = Path(__file__).resolve().parents[3]
ARTIFACT = get_task("t0_artifact")


def job_script(name: str, **subst: object) -> str:
    return fill((JOBS / name).read_text(), **subst)


@pytest.fixture
def token() -> str:
    return f"hf_isolation_{uuid.uuid4().hex}"


@pytest.fixture
def emu(make_emulator: Callable[..., HfEmulator], job_python: str, token: str) -> HfEmulator:
    emulator = make_emulator(interpreter=job_python, token=token)
    assert emulator.isolation is not None and emulator.isolation.cgroups is not None
    return emulator


def register_dataset(emu: HfEmulator, root: Path, repo_id: str, records: list[dict[str, Any]]) -> None:
    source = root / repo_id.replace("/", "--")
    write_dataset_repo(source, records)
    emu.repos.register("dataset", repo_id, "main", source)


def submit(
    emu: HfEmulator,
    script: str,
    *,
    role: str = "agent",
    inputs: dict[str, str] | None = None,
    volumes: list[Volume] | None = None,
    env: dict[str, str] | None = None,
    output_bucket: str | None = None,
    timeout: int = 300,
    limits: dict[str, int] | None = None,
) -> str:
    caps = launcher.Limits(**(limits or {}))
    spec = launcher.JobSpec(role=role, script=script, inputs=inputs or {}, output_dir="/outputs", limits=caps)
    bucket = output_bucket or f"{emu.namespace}/out-{uuid.uuid4().hex[:8]}"
    api = HfApi(endpoint=emu.url, token=emu.token)
    job = api.run_job(
        image=IMAGE,
        command=["python", "-m", "posttrain_launcher"],
        env={"POSTTRAIN_JOB_SPEC": spec.to_json(), **(env or {})},
        secrets={},
        flavor="cpu-basic",
        timeout=timeout,
        volumes=[*(volumes or []), Volume(type="bucket", source=bucket, mount_path="/outputs")],
        namespace=emu.namespace,
    )
    return job.id


def bucket_of(emu: HfEmulator, job_id: str) -> str:
    volumes = emu.job(job_id)["volumes"]
    return next(v["source"] for v in volumes if v["mountPath"] == "/outputs")


def read_output(emu: HfEmulator, job_id: str, name: str = "result.json") -> Any:
    fs = HfFileSystem(endpoint=emu.url, token=emu.token, skip_instance_cache=True)
    return json.loads(fs.cat_file(f"hf://buckets/{bucket_of(emu, job_id)}/{name}"))


def finish(emu: HfEmulator, job_id: str, timeout: float = 240) -> tuple[str, str | None, list[str]]:
    api = HfApi(endpoint=emu.url, token=emu.token)
    info = wait_terminal(api, emu, job_id, timeout=timeout)
    logs = list(api.fetch_job_logs(job_id=job_id, namespace=emu.namespace))
    return info.status.stage, info.status.message, logs


def test_a_lingering_process_is_gone_before_the_next_job_and_cannot_touch_a_score(
    emu: HfEmulator, data_dir: Path
) -> None:
    marker = f"lingering-{uuid.uuid4().hex}"
    agent = submit(emu, job_script("lingering_daemon.py", MARKER=marker, END="exit"))
    stage, message, logs = finish(emu, agent)
    assert stage == "COMPLETED", (message, logs)
    assert "daemon left behind" in logs  # the daemon did run
    # Confirmed gone when the stage turned terminal: no wait here.
    assert host_pids_with(marker) == set()
    assert emu.job_pids(agent) == set()

    # The agent's outputs hold no answer.json: an empty checkpoint must score 0, whatever the
    # daemon planted while it lived.
    register_dataset(emu, data_dir, "org/artifact-hidden", [{"key": "k00", "expected": 7}])
    grader = submit(
        emu,
        ARTIFACT.grader_script(),
        role="grader",
        inputs={"checkpoint": "/inputs/checkpoint", "split": "/inputs/split"},
        volumes=[
            Volume(
                type="bucket", source=bucket_of(emu, agent), mount_path="/inputs/checkpoint", read_only=True
            ),
            Volume(type="dataset", source="org/artifact-hidden", mount_path="/inputs/split", revision="main"),
        ],
    )
    stage, message, logs = finish(emu, grader)
    assert stage == "COMPLETED", (message, logs)
    result = read_output(emu, grader)
    assert (result["status"], result["score"], result["grader_version"]) == (
        "invalid_checkpoint",
        0.0,
        "artifact/2",
    )
    assert "no answer.json" in result["reason"]


@pytest.mark.parametrize(
    ("end", "timeout", "want_message"),
    [
        ("fail", 300, "Job failed with exit code: 3"),
        # Long enough for the daemon to start first on a loaded machine; the logs show it did.
        ("hang", 60, "timeout: the job exceeded its timeout of 60s"),
    ],
    ids=["failure", "timeout"],
)
def test_a_lingering_process_is_gone_when_its_job_fails_or_times_out(
    emu: HfEmulator, end: str, timeout: int, want_message: str
) -> None:
    marker = f"lingering-{uuid.uuid4().hex}"
    agent = submit(emu, job_script("lingering_daemon.py", MARKER=marker, END=end), timeout=timeout)
    stage, message, logs = finish(emu, agent, timeout=timeout + 240)
    assert (stage, message) == ("ERROR", want_message), logs
    assert "daemon left behind" in logs
    assert host_pids_with(marker) == set()  # confirmed gone when the stage turned terminal
    assert emu.job_pids(agent) == set()


def hold_a_hidden_split(emu: HfEmulator, data_dir: Path, marker: str, env: dict[str, str]) -> tuple[str, str]:
    """A running job with a split holding `marker` mounted and `env` in its environment: (its id,
    the marker on its child's command line, once that child runs)."""
    register_dataset(emu, data_dir, "org/hidden", [{"key": marker, "expected": 1}])
    process_marker = f"holder-{uuid.uuid4().hex}"
    job = submit(
        emu,
        sleeper(process_marker),
        inputs={"split": "/inputs/split"},
        volumes=[Volume(type="dataset", source="org/hidden", mount_path="/inputs/split", revision="main")],
        env=env,
    )
    wait_for_processes(process_marker)
    return job, process_marker


@pytest.fixture
def abstract_socket() -> Iterator[tuple[str, socket.socket]]:
    """A listening abstract unix socket in the host's network namespace."""
    name = f"posttrain-isolation-{uuid.uuid4().hex}"
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind("\0" + name)
    sock.listen(4)
    try:
        yield name, sock
    finally:
        sock.close()


def test_a_job_cannot_read_trace_or_signal_a_sibling_nor_reach_a_host_socket(
    emu: HfEmulator, data_dir: Path, abstract_socket: tuple[str, socket.socket]
) -> None:
    secret_value = f"victim-value-{uuid.uuid4().hex}"
    split_marker = f"hidden-split-{uuid.uuid4().hex}"
    victim, victim_marker = hold_a_hidden_split(emu, data_dir, split_marker, {"VICTIM_VALUE": secret_value})
    victim_pids = emu.job_pids(victim)
    assert host_pids_with(victim_marker) <= victim_pids  # the pids handed to the attacker are real

    name, listener = abstract_socket
    attacker = submit(
        emu,
        job_script(
            "sibling_attack.py",
            VICTIM_PIDS=",".join(str(p) for p in sorted(victim_pids)),
            ABSTRACT=name,
            VICTIM_VALUE=secret_value,
            SPLIT_MARKER=split_marker,
        ),
    )
    stage, message, logs = finish(emu, attacker)
    assert stage == "COMPLETED", (message, logs)
    result = read_output(emu, attacker)

    for pid, attempts in result["attempts"].items():
        # Another job's processes do not exist for it: nothing to read, trace or signal.
        assert attempts == {
            "environ": "ENOENT",
            "mem": "ENOENT",
            "cmdline": "ENOENT",
            "signal_0": "ESRCH",
            "sigterm": "ESRCH",
            "ptrace": "ESRCH",
        }, pid
    assert result["found"] == []
    assert len(result["visible_pids"]) == 3  # its init, its launcher and itself: nothing else
    assert result["abstract_socket"] == "ECONNREFUSED"
    assert emu.job(victim)["status"]["stage"] == "RUNNING"  # untouched

    # The control: from the host, the same socket answers.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as client:
        client.connect("\0" + name)
        listener.accept()[0].close()
    HfApi(endpoint=emu.url, token=emu.token).cancel_job(job_id=victim, namespace=emu.namespace)
    assert finish(emu, victim)[0] == "CANCELED"
    assert host_pids_with(victim_marker) == set()


SIBLING = (
    "import json, os\n"
    "total = 0\n"
    "for round in range(30):\n"
    "    total += sum(range(200_000))\n"
    "open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'result.json'), 'w').write(json.dumps(total))\n"
)


def test_a_fork_bomb_and_a_memory_bomb_fail_their_own_jobs_while_a_sibling_completes(
    make_emulator: Callable[..., HfEmulator], job_python: str
) -> None:
    # A small machine: 64 processes and 512 MiB per job, whatever the flavor says.
    emu = make_emulator(interpreter=job_python, max_job_processes=64, max_job_memory_bytes=512 << 20)
    sibling = submit(emu, SIBLING)
    fork_bomb = submit(emu, FORK_BOMB)
    memory_bomb = submit(emu, MEMORY_BOMB)

    stage, message, logs = finish(emu, fork_bomb)
    assert (stage, message) == ("ERROR", "the job reached its limit of 64 processes and threads"), logs
    stage, message, logs = finish(emu, memory_bomb)
    assert stage == "ERROR", logs
    assert message is not None and message.startswith(
        f"out of memory: the job used all of its {512 << 20} bytes"
    )
    for job_id in (fork_bomb, memory_bomb):
        assert emu.job_pids(job_id) == set()

    stage, message, logs = finish(emu, sibling)
    assert stage == "COMPLETED", (message, logs)
    assert read_output(emu, sibling) == 30 * sum(range(200_000))


def test_a_published_link_to_a_private_directory_leaves_it_private(emu: HfEmulator, data_dir: Path) -> None:
    private = data_dir / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("s")
    script = (
        "import os\n"
        f"os.symlink({str(private)!r}, os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'link'))\n"
        "open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'answer.json'), 'w').write('{}')\n"
    )
    agent = submit(emu, script)
    stage, message, _ = finish(emu, agent)
    assert stage == "ERROR"
    assert message is not None
    assert message.startswith("outputs not published: 'link' is a symbolic link to")
    assert stat.S_IMODE(private.stat().st_mode) == 0o700

    # A grader-style job mounting those outputs read-only: nothing was published, nothing chmodded.
    reader = submit(
        emu,
        "import os\nprint(sorted(os.listdir(os.environ['POSTTRAIN_INPUT_CHECKPOINT'])))\n",
        inputs={"checkpoint": "/inputs/checkpoint"},
        volumes=[
            Volume(
                type="bucket", source=bucket_of(emu, agent), mount_path="/inputs/checkpoint", read_only=True
            )
        ],
    )
    stage, message, logs = finish(emu, reader)
    assert stage == "COMPLETED", (message, logs)
    assert "[]" in logs
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


@pytest.fixture
def leaked_on_the_host(token: str) -> Iterator[tuple[str, Path]]:
    """The hidden split and the token where the issue found them: a world-readable asset cache in
    the host's temporary directory, and a process with the token on its command line."""
    marker = f"hidden-marker-{uuid.uuid4().hex}"
    cache = Path(tempfile.mkdtemp(prefix="posttrain-assets-"))
    cache.chmod(0o755)
    (cache / "data.jsonl").write_text(json.dumps({"key": marker, "expected": 1}) + "\n")
    (cache / "token.txt").write_text(token)
    (cache / "data.jsonl").chmod(0o644)
    (cache / "token.txt").chmod(0o644)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(600)", f"--token={token}"],
        env={"HF_TOKEN": token, "PATH": "/usr/bin:/bin"},
    )
    try:
        yield marker, cache
    finally:
        holder.kill()
        holder.wait()
        remove_tree(cache)


def test_a_job_scanning_proc_and_the_file_system_finds_only_its_own_inputs(
    emu: HfEmulator, data_dir: Path, job_python: str, token: str, leaked_on_the_host: tuple[str, Path]
) -> None:
    hidden_marker, cache = leaked_on_the_host
    own_marker = f"own-marker-{uuid.uuid4().hex}"
    register_dataset(emu, data_dir, "org/own", [{"key": own_marker, "expected": 1}])
    # Another job holds the hidden split mounted while the scan runs.
    holder, _ = hold_a_hidden_split(emu, data_dir, hidden_marker, {"HOLDER_TOKEN_COPY": token})
    # The controls: all of these are readable on the host right now.
    assert hidden_marker in (cache / "data.jsonl").read_text()
    assert hidden_marker in (emu.job_root(holder) / "inputs" / "split" / "data.jsonl").read_text()

    libraries = ["/usr", *(b.source for b in python_binds(job_python))]
    scanner = submit(
        emu,
        job_script(
            "scan_view.py",
            TOKEN=token,
            HIDDEN_MARKER=hidden_marker,
            OWN_MARKER=own_marker,
            SKIP=json.dumps(libraries).encode().hex(),
        ),
        inputs={"own": "/inputs/own"},
        volumes=[Volume(type="dataset", source="org/own", mount_path="/inputs/own", revision="main")],
    )
    stage, message, logs = finish(emu, scanner)
    assert stage == "COMPLETED", (message, logs)
    result = read_output(emu, scanner)
    job_dir = emu.data_dir / "jobs" / scanner
    assert result["found"]["token"] == []
    assert result["found"]["hidden"] == []
    assert result["found"]["own"] == [str(job_dir / "root" / "inputs" / "own" / "data.jsonl")]
    assert result["files_read"] > 0

    # Its view: its own tree, the system and the interpreter's libraries, its own memory cgroup
    # (read-only), nothing else of the host.
    allowed_exact = {"/", "/tmp", "/proc", "/dev", "/dev/shm", "/sys/fs/cgroup/memory", *libraries}
    allowed_exact |= {"/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d"}
    for mount in result["mounts"]:
        assert (
            mount in allowed_exact
            or mount.startswith("/dev/")
            or mount == str(job_dir / "root")
            or mount == str(job_dir / "work")
            or mount.startswith(str(job_dir / "root") + "/")
        ), mount
    assert str(REPO_ROOT) not in result["mounts"]
    assert not any(m.startswith(str(cache)) for m in result["mounts"])
    # Of the checkout, only what the launcher image carries: its packages and the installed task plugins.
    assert {m for m in libraries if m.startswith(str(REPO_ROOT) + "/") and "site-packages" not in m} <= {
        str(REPO_ROOT / "graders"),
        str(REPO_ROOT / "launcher_image" / "posttrain_launcher"),
        str(REPO_ROOT / "examples" / "linear-map-task" / "posttrain_task_linear"),
        str(REPO_ROOT / "tasks" / "gsm8k" / "posttrain_task_gsm8k"),
    }
    HfApi(endpoint=emu.url, token=emu.token).cancel_job(job_id=holder, namespace=emu.namespace)


CPU_HOG = """
import json, os, time
WORKERS, SECONDS = 4, 6.0
started = time.monotonic()
for _ in range(WORKERS):
    if os.fork() == 0:
        until = time.monotonic() + SECONDS
        while time.monotonic() < until:
            pass
        os._exit(0)
for _ in range(WORKERS):
    os.wait()
spent = os.times()
cpu = spent.children_user + spent.children_system
print(json.dumps({"cores_used": cpu / (time.monotonic() - started)}))
"""
# The work of a grader job: a fixed amount of arithmetic, and the cores it had for it.
GRADER_WORK = """
import json, time
wall, cpu = time.monotonic(), time.process_time()
total = sum(i * i for i in range(15_000_000))
print(json.dumps({"cores_used": (time.process_time() - cpu) / (time.monotonic() - wall)}))
"""


def cores_used(logs: list[str]) -> float:
    return float(json.loads(next(line for line in logs if line.startswith('{"cores_used"')))["cores_used"])


def test_a_cpu_bound_job_is_held_to_its_flavors_cores_beside_a_grader_job(
    make_emulator: Callable[..., HfEmulator], job_python: str
) -> None:
    # A small machine: each job gets one core (a CFS quota), whatever its flavor says.
    emu = make_emulator(interpreter=job_python, max_job_cpu_cores=1)
    assert emu.isolation is not None and emu.isolation.cgroups is not None
    if not emu.isolation.cgroups.bounds_cpu:
        pytest.skip("no cgroup v1 cpu controller here: jobs run without a CPU bound")
    hog = submit(emu, CPU_HOG)
    wait_for(lambda: len(emu.job_pids(hog)) >= 4, timeout=120, what="the hog's four busy workers")
    assert emu.job_cpu_quota(hog) == 1.0  # as the kernel holds it
    grader = submit(emu, GRADER_WORK)

    stage, message, grader_logs = finish(emu, grader)
    assert stage == "COMPLETED", (message, grader_logs)
    stage, message, hog_logs = finish(emu, hog)
    assert stage == "COMPLETED", (message, hog_logs)
    hog_cores, grader_cores = cores_used(hog_logs), cores_used(grader_logs)
    print(f"four busy workers held to {hog_cores:.2f} cores; the job beside them had {grader_cores:.2f}")
    # The kernel enforces the quota whatever else loads the machine: four workers, at most one core
    # (a loaded machine may give them less; a quiet one gives the job beside them its core).
    assert hog_cores <= 1.1, hog_cores


MANY_SMALL_FILES = """
import os, time
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
open(os.path.join(out, "metrics.json"), "w").write("{}")
for root in (os.environ["HOME"], os.environ["TMPDIR"]):
    for i in range(48):
        with open(os.path.join(root, f"cache-{i}.bin"), "wb") as f:
            f.write(os.urandom(1 << 20))  # 96 files of 1 MiB, each far under the file cap
print("written", flush=True)
time.sleep(300)  # the launcher's scan stops it
"""


def test_many_small_files_past_the_scratch_bound_stop_the_job_and_publish_nothing(emu: HfEmulator) -> None:
    job = submit(emu, MANY_SMALL_FILES, limits={"max_scratch_bytes": 64 << 20, "max_file_bytes": 16 << 20})
    stage, message, logs = finish(emu, job)
    assert stage == "ERROR", (message, logs)
    assert "written" in logs  # the files were written before the stop
    assert message == "Job failed with exit code: 5"
    assert "passed max_scratch_bytes (67108864)" in logs[-1], logs[-5:]
    # Nothing of it is published, the metrics it wrote first included.
    fs = HfFileSystem(endpoint=emu.url, token=emu.token, skip_instance_cache=True)
    assert fs.find(f"hf://buckets/{bucket_of(emu, job)}") == []


def test_a_job_cannot_write_to_its_containers_work_dir_on_the_hosts_disk(emu: HfEmulator) -> None:
    """Its one writable place on the host's disk is its outputs (bounded in total); the container's
    work dir next to them is root's. The job learns the path from its mounts, as an attacker would."""
    script = (
        "import os\n"
        "mounts = [line.split()[4] for line in open('/proc/self/mountinfo')]\n"
        "root = next(m for m in mounts if m.endswith('/root'))\n"
        "work = os.path.join(os.path.dirname(root), 'work')\n"
        "print('work dir', os.path.isdir(work))\n"
        "try:\n"
        "    open(os.path.join(work, 'filler.bin'), 'wb').write(b'x' * 4096)\n"
        "    print('written')\n"
        "except PermissionError as exc:\n"
        "    print('refused', exc.errno)\n"
    )
    job = submit(emu, script)
    stage, message, logs = finish(emu, job)
    assert stage == "COMPLETED", (message, logs)
    assert "work dir True" in logs and "refused 13" in logs, logs
    assert not (emu.job_root(job).parent / "work" / "filler.bin").exists()


def test_the_jobs_cgroup_holds_its_memory_so_a_reservation_past_it_is_allowed(
    make_emulator: Callable[..., HfEmulator], job_python: str
) -> None:
    """On a backend whose cgroup holds the job, the launcher sets no RLIMIT_DATA: a job may reserve
    address space as CUDA does; what it touches is still bounded (the memory bomb test)."""
    emu = make_emulator(interpreter=job_python, max_job_memory_bytes=512 << 20)
    job = submit(emu, fill(RESERVE_TWICE_THE_MEMORY, MEMORY=512 << 20))
    stage, message, logs = finish(emu, job)
    assert stage == "COMPLETED", (message, logs)
    assert f"posttrain-launcher: memory: {512 << 20} bytes, held by its cgroup's limit" in "\n".join(logs)
    assert f"reserved {1 << 30}" in logs

    # Its cgroup is shown to it read-only: it cannot raise its own limit.
    raise_limit = (
        "try:\n"
        "    open('/sys/fs/cgroup/memory/memory.limit_in_bytes', 'w').write(str(64 << 30))\n"
        "    print('raised')\n"
        "except OSError as exc:\n"
        "    print('refused', exc.errno)\n"
        "print('limit', open('/sys/fs/cgroup/memory/memory.limit_in_bytes').read().strip())\n"
    )
    stage, message, logs = finish(emu, submit(emu, raise_limit))
    assert stage == "COMPLETED", (message, logs)
    assert any(line.startswith("refused ") for line in logs) and f"limit {512 << 20}" in logs, logs
