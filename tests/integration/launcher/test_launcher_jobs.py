"""What a launched job can still do, and how the launcher bounds and reports it."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from pathlib import Path

import pytest
from posttrain_launcher import JobSpec, Limits, launcher_command, launcher_env

from tests.helpers import wait_for

from .support import FLAVOR_ENV, Launch, job_script, requires_root

pytestmark = requires_root


def test_unix_sockets_threads_multiprocessing_and_numpy_work(launch: Launch) -> None:
    job = launch(job_script("capabilities_probe.py"))
    assert job.returncode == 0, job.stderr
    assert job.result() == {
        "unix": "pingpong",
        "threads": 285,
        "mp_fork_pool": 285,
        "mp_spawn": 49,
        "mp_manager": [1, 2, 3, 4],
        "numpy": 45.0,
    }


def test_stdout_and_stderr_are_relayed_and_the_exit_code_is_the_scripts(launch: Launch) -> None:
    job = launch("import sys\nprint('to stdout')\nprint('to stderr', file=sys.stderr)\nsys.exit(7)")
    assert job.returncode == 7
    assert job.stdout == "to stdout\n"
    assert "to stderr\n" in job.stderr


def test_a_job_killed_by_a_signal_exits_128_plus_the_signal(launch: Launch) -> None:
    job = launch("import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert job.returncode == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in job.stderr


def test_a_long_log_keeps_its_head_and_its_end_in_the_stream_and_whole_in_the_outputs(
    launch: Launch,
) -> None:
    # One stream: the order of two pipes' reads is the launcher's, not the job's.
    script = "for i in range(4000):\n    print(f'line {i:05d}')\nprint('the last line')"
    job = launch(script, limits=Limits(max_log_bytes=4096, max_log_file_bytes=1 << 20))
    assert job.returncode == 0
    assert job.stdout.startswith("line 00000\nline 00001\n")
    assert job.stdout.endswith("line 03999\nthe last line\n")
    marker = [ln for ln in job.stderr.splitlines() if ln.startswith("posttrain-launcher: log:")]
    assert len(marker) == 1 and "bytes skipped after the first 3072" in marker[0]
    assert len(job.stdout.encode()) <= 4096
    # The copy in the outputs has every line: it is within its own cap.
    copy = (job.output_dir / "posttrain-job.log").read_text().splitlines()
    assert copy == [f"line {i:05d}" for i in range(4000)] + ["the last line"]
    assert (job.output_dir / "posttrain-job.log").stat().st_uid == 0  # the job cannot rewrite it


def test_the_log_copy_is_a_new_file_even_where_the_job_planted_a_link(launch: Launch, tmp_path: Path) -> None:
    # A job cannot make the launcher (root) write through a link: the copy is created before any job
    # code runs, as a new file; a link the job makes afterwards only replaces its name.
    target = tmp_path / "victim"
    target.write_text("untouched")
    target.chmod(0o666)
    script = (
        "import os\nout = os.environ['POSTTRAIN_OUTPUT_DIR']\n"
        "os.unlink(os.path.join(out, 'posttrain-job.log'))\n"
        f"os.symlink({str(target)!r}, os.path.join(out, 'posttrain-job.log'))\n"
        "print('written after the swap')\n"
    )
    job = launch(script, limits=Limits(max_log_file_bytes=1 << 20))
    assert job.returncode == 0, job.stderr
    assert target.read_text() == "untouched"


def test_the_script_is_copied_into_the_outputs_as_the_launchers_read_only_file(
    launch: Launch, job_root: Path, tmp_path: Path
) -> None:
    # The score job's evidence of what ran (graders/integrity/checks.py). A link planted where the
    # copy goes is replaced, never written through.
    target = tmp_path / "victim"
    target.write_text("untouched")
    target.chmod(0o666)
    (job_root / "outputs").mkdir(exist_ok=True)
    (job_root / "outputs" / "posttrain-script.py").symlink_to(target)
    script = (
        "import os\ncopy = os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'posttrain-script.py')\n"
        "try:\n    open(copy, 'a').write('# appended')\nexcept PermissionError:\n    print('read-only')\n"
    )
    job = launch(script)
    assert job.returncode == 0 and job.stdout == "read-only\n", job.stderr
    copy = job.output_dir / "posttrain-script.py"
    assert not copy.is_symlink() and copy.read_text() == script
    assert (copy.stat().st_uid, stat.S_IMODE(copy.stat().st_mode)) == (0, 0o444)
    assert target.read_text() == "untouched"


def test_a_script_of_the_largest_size_allowed_runs_whole(launch: Launch) -> None:
    # Past the 128 KiB one environment variable may hold: the spec comes in parts (spec.py).
    filler = "# " + "é" * 40 + "\n"
    script = filler * (250 * 1024 // len(filler.encode())) + "print('ran', len(open(__file__).read()))\n"
    job = launch(script)
    assert job.returncode == 0, job.stderr
    assert job.stdout == f"ran {len(script)}\n"
    assert (job.output_dir / "posttrain-script.py").read_text() == script


def test_a_grader_job_gets_no_script_copy(launch: Launch) -> None:
    job = launch("print('graded')", role="grader")
    assert job.returncode == 0, job.stderr
    assert not (job.output_dir / "posttrain-script.py").exists()


def test_outputs_past_the_total_cap_stop_the_job(launch: Launch) -> None:
    # Each file stays under the per-file cap; together they pass the total. The job then idles:
    # the launcher's scan must kill it, not wait for it.
    script = (
        "import os, time\n"
        "out = os.environ['POSTTRAIN_OUTPUT_DIR']\n"
        "os.makedirs(os.path.join(out, 'shards'))\n"
        "os.symlink('/etc', os.path.join(out, 'etc'))\n"
        "for i in range(3):\n"
        "    open(os.path.join(out, 'shards', f'part{i}'), 'wb').write(b'x' * 600_000)\n"
        "time.sleep(120)\n"
        "open(os.path.join(out, 'survived'), 'w').write('yes')\n"
    )
    job = launch(script, limits=Limits(max_output_bytes=1_000_000))
    assert job.returncode == 3
    assert "error: the job's outputs passed max_output_bytes (1000000)" in job.stderr
    assert "killed by SIGKILL" in job.stderr
    # Nothing of a stopped job is left to publish, and removing it followed no link.
    assert list(job.output_dir.iterdir()) == [] and os.path.exists("/etc/passwd")


@pytest.mark.parametrize("where", ["POSTTRAIN_OUTPUT_DIR", "TMPDIR"])
def test_a_file_past_max_file_bytes_fails_the_job_with_the_cap_named(launch: Launch, where: str) -> None:
    script = f"import os\nopen(os.path.join(os.environ[{where!r}], 'shard'), 'wb').write(b'x' * 300_000)"
    job = launch(script, limits=Limits(max_output_bytes=1_000_000, max_file_bytes=200_000))
    assert "File too large" in job.stderr  # the job's own error, as Python reports EFBIG
    assert job.returncode == 4
    assert "shard reached max_file_bytes (200000): a write past it was refused" in job.stderr


def test_sigterm_to_the_launcher_reaches_the_job(job_python: str, job_root: Path) -> None:
    script = (
        "import os, signal, sys, time\n"
        "def bye(*_):\n"
        "    open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'got-sigterm'), 'w').close()\n"
        "    sys.exit(143)\n"
        "signal.signal(signal.SIGTERM, bye)\n"
        "print('ready', flush=True)\n"
        "time.sleep(120)\n"
    )
    spec = JobSpec(role="agent", script=script, output_dir="/outputs")
    proc = subprocess.Popen(
        launcher_command(job_python),
        env=launcher_env(spec, root=str(job_root), base={**os.environ, **FLAVOR_ENV}),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"ready\n"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 143
    finally:
        proc.kill()
        proc.wait()
    assert (job_root / "outputs" / "got-sigterm").exists()


def test_scratch_is_private_and_removed_afterwards(launch: Launch) -> None:
    script = (
        "import json, os, stat, tempfile\n"
        "home = os.environ['HOME']\n"
        "private = os.path.dirname(home)\n"
        "scratch = os.path.dirname(private)\n"
        "try:\n    os.listdir(scratch)\n    listable = True\nexcept PermissionError:\n    listable = False\n"
        "info = {'home': home, 'tmp': tempfile.gettempdir(), 'cwd': os.getcwd()}\n"
        "info['scratch_listable'] = listable\n"
        "info['private_mode'] = stat.S_IMODE(os.stat(private).st_mode)\n"
        "info['script_writable'] = os.access(os.path.join(scratch, 'script.py'), os.W_OK)\n"
        "info['scratch_writable'] = os.access(scratch, os.W_OK)\n"
        "open(os.path.join(home, 'f'), 'w').write('x')\n"
        "json.dump(info, open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'result.json'), 'w'))\n"
    )
    job = launch(script)
    assert job.returncode == 0, job.stderr
    info = job.result()
    private = Path(info["home"]).parent
    scratch = private.parent
    assert Path(info["tmp"]).parent == private
    assert info["cwd"] == info["home"]  # an agent works in its own home
    assert len(private.name) == 32  # 128 random bits: no other job can guess or pre-create it
    assert info["private_mode"] == 0o700
    assert info["scratch_listable"] is False
    assert info["scratch_writable"] is False
    assert info["script_writable"] is False
    assert not scratch.exists()


def test_an_unprivileged_launcher_still_locks_the_job_down(job_python: str, job_root: Path) -> None:
    """The image runs as USER 10000: no drop, but the same filter, and the launcher's environ
    (unscrubbed, same uid) stays unreadable because the launcher makes itself non-dumpable."""
    script = (
        "import json, os, socket\n"
        "r = {}\n"
        "try:\n    socket.socket(socket.AF_INET)\n    r['inet'] = 'ok'\n"
        "except OSError as e:\n    r['inet'] = e.errno\n"
        "try:\n    open(f'/proc/{os.getppid()}/environ', 'rb').read()\n    r['parent'] = 'ok'\n"
        "except OSError as e:\n    r['parent'] = e.errno\n"
        "st = dict(l.split(':', 1) for l in open('/proc/self/status'))\n"
        "r['uid'] = st['Uid'].split()[0]\n"
        "r['seccomp'] = st['Seccomp'].strip()\n"
        "json.dump(r, open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'result.json'), 'w'))\n"
    )
    out = job_root / "outputs"
    out.mkdir()
    os.chown(out, 10000, 10000)
    spec = JobSpec(role="agent", script=script, output_dir="/outputs")
    env = launcher_env(
        spec, root=str(job_root), base={**os.environ, **FLAVOR_ENV, "HF_TOKEN": "hf_unprivileged_sentinel"}
    )
    proc = subprocess.run(
        launcher_command(job_python),
        env=env,
        user=10000,
        group=10000,
        extra_groups=[],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    result = json.loads((out / "result.json").read_text())
    assert result == {"inet": 13, "parent": 13, "uid": "10000", "seccomp": "2"}


def test_a_job_that_leaves_a_process_behind_does_not_hang_the_launcher(launch: Launch) -> None:
    # The grandchild keeps the log pipes open; the launcher stops waiting for them shortly after
    # the job exits and kills what is left in the job's process group.
    script = (
        "import os, subprocess, sys\n"
        "p = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)'])\n"
        "open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'pid'), 'w').write(str(p.pid))\n"
    )
    job = launch(script, timeout=60)
    assert job.returncode == 0, job.stderr
    pid = int((job.output_dir / "pid").read_text())
    wait_for(lambda: not _alive(pid), timeout=10, interval=0.05, what=f"the left-behind process {pid} to end")


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize(
    ("packages", "want"),
    [
        pytest.param(["docopt==0.6.2"], "package install failed", id="sdist-only package"),
        pytest.param(["six @ https://example.com/six.whl"], "refused", id="URL requirement"),
        pytest.param(["--index-url=https://example.com/simple", "six"], "refused", id="index-url injection"),
        pytest.param(["-e", "."], "refused", id="editable injection"),
        pytest.param([f"pkg{i}" for i in range(33)], "at most 32", id="oversize list"),
    ],
)
def test_package_policy_refuses_before_any_script_runs(
    launch: Launch, job_root: Path, packages: list[str], want: str
) -> None:
    script = "import os\nopen(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'ran'), 'w').close()"
    # JobSpec would reject the oversize list itself; pass the raw JSON as a backend might.
    raw = {"version": 1, "role": "agent", "script": script, "packages": packages, "output_dir": "/outputs"}
    job = launch(script, spec_json=json.dumps(raw))
    assert job.returncode == 2
    last = job.stderr.strip().splitlines()[-1]
    assert last.startswith("posttrain-launcher: error: ")
    assert want in last
    assert not (job_root / "outputs" / "ran").exists()


def test_a_wheel_installs_into_the_job_local_target(launch: Launch) -> None:
    script = (
        "import json, os, six\n"
        "r = {'version': six.__version__, 'file': six.__file__, 'path': os.environ['PYTHONPATH']}\n"
        "json.dump(r, open(os.path.join(os.environ['POSTTRAIN_OUTPUT_DIR'], 'result.json'), 'w'))\n"
    )
    job = launch(script, packages=["six==1.17.0"])
    assert job.returncode == 0, job.stderr
    result = job.result()
    assert result["version"] == "1.17.0"
    target = result["path"].split(os.pathsep)[0]
    assert result["file"] == os.path.join(target, "six.py")
    assert "installed 1 package(s): six==1.17.0" in job.stderr
