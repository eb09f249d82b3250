"""prepare (spec, packages, directories; may refuse) -> fork -> lock down + exec the script -> relay.

The launcher stays outside the sandbox as the job's parent: it relays the job's stdout/stderr under
the log cap, watches the output dir against the total cap, forwards SIGTERM/SIGINT to the job's
process group, and exits with the job's code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import secrets
import selectors
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping
from types import FrameType

from . import egress, environment, joblog, network, packages, sandbox
from .bounds import Bounds, BoundsError, cgroup_memory_limit, derive_bounds
from .outputs import clear_outputs, file_at, tree_size
from .spec import ROOT_ENV, JobSpec, SpecError, host_path, load_spec

PREFIX = joblog.PREFIX
EXIT_REFUSED = 2  # the launcher refused the job; no job code ran
EXIT_OUTPUT_CAP = 3  # the job was stopped: its outputs passed max_output_bytes
EXIT_FILE_CAP = 4  # the job failed with a file at max_file_bytes: a write past it was refused
EXIT_SCRATCH_CAP = 5  # the job was stopped: its HOME and TMPDIR passed max_scratch_bytes

# The agent job's script, copied into its outputs (graders/integrity/checks.py reads it by this name).
SCRIPT_COPY_NAME = "posttrain-script.py"
OUTPUT_SCAN_SECONDS = 2.0
# After the job exits, how long its leftover descendants may keep the log pipes open.
DRAIN_SECONDS = 2.0
_POLL_SECONDS = 0.25
_READ_CHUNK = 64 * 1024


class Refusal(Exception):
    """A reason to refuse the job before any of its code runs."""


@dataclasses.dataclass(frozen=True)
class PreparedJob:
    spec: JobSpec
    scratch: str  # root-owned, 0711: the job can reach what is in it but cannot list or change it
    private: str  # the job's own HOME and TMPDIR, 0700, under an unguessable name
    script: str  # root-owned, read-only
    cwd: str
    output_dir: str
    inputs: dict[str, str]
    env: dict[str, str]
    bounds: Bounds
    network: network.Network
    log_fd: int | None  # the log's copy in the outputs (write-only, not inherited by the job)


def _say(message: str) -> None:
    sys.stderr.write(PREFIX + message + "\n")
    sys.stderr.flush()


def _chown_to_job(path: str) -> None:
    if os.geteuid() == 0:
        os.chown(path, sandbox.JOB_UID, sandbox.JOB_GID)


def prepare(environ: Mapping[str, str]) -> PreparedJob:
    """Parse and check everything, lay out scratch, install packages. Raises Refusal.

    Scratch, for a job started as root: `<TMPDIR>/posttrain-job-XXXXXXXX/` (root, 0711) holding
    `script.py` (root, 0444), `packages/` (root) and `<32 hex>/{home,tmp}` (the job's, 0700). Nothing
    the job can write is on its `sys.path` (`python -P`, PYTHONPATH root-owned) and, for a grader,
    its working directory is the root-owned scratch: code left behind by another job of the same
    uid can neither find the private dir nor shadow a module the grader imports.
    """
    try:
        spec = load_spec(environ)
        requirements = packages.check_requirements(spec.packages)
        bounds = derive_bounds(environ, spec.limits, cgroup_memory_limit())
        net = network.establish(spec.network)
    except (SpecError, packages.PackagePolicyError, BoundsError, network.NetworkRefused) as exc:
        raise Refusal(str(exc)) from None

    root, inputs, output_dir = _host_paths(environ, spec)

    scratch = tempfile.mkdtemp(prefix="posttrain-job-")
    try:
        private, script = _lay_out_scratch(scratch, spec.script)
        package_dir = None
        if requirements:
            package_dir = os.path.join(scratch, "packages")
            try:
                packages.install(requirements, package_dir, environ, root)
            except packages.InstallError as exc:
                raise Refusal(f"package install failed: {exc}") from None
            _say(f"installed {len(requirements)} package(s): {' '.join(requirements)}")
        env = environment.job_environment(
            environ, spec, inputs=inputs, output_dir=output_dir, private=private, package_dir=package_dir
        )
        if spec.role == "agent":
            try:
                copy_script(output_dir, spec.script)
            except OSError as exc:
                raise Refusal(f"cannot copy the script into {output_dir}: {exc}") from None
        log_fd = None
        if spec.limits.max_log_file_bytes:
            try:
                log_fd = joblog.open_log_file(output_dir)
            except OSError as exc:
                raise Refusal(f"cannot create the log file in {output_dir}: {exc}") from None
    except BaseException:
        shutil.rmtree(scratch, ignore_errors=True)
        raise
    cwd = scratch if spec.role == "grader" else env["HOME"]
    return PreparedJob(spec, scratch, private, script, cwd, output_dir, inputs, env, bounds, net, log_fd)


def _host_paths(environ: Mapping[str, str], spec: JobSpec) -> tuple[str, dict[str, str], str]:
    """The root the job's paths are under, its inputs (each must exist) and its output dir (made, the
    job's), as paths on this host."""
    root = environ.get(ROOT_ENV, "/") or "/"
    if not os.path.isabs(root) or not os.path.isdir(root):
        raise Refusal(f"{ROOT_ENV}={root!r} is not an existing absolute directory")
    inputs = {name: host_path(root, path) for name, path in spec.inputs.items()}
    for name, path in inputs.items():
        if not os.path.exists(path):
            raise Refusal(f"input {name!r} not found at {path}")
    output_dir = host_path(root, spec.output_dir)
    try:
        os.makedirs(output_dir, exist_ok=True)
        _chown_to_job(output_dir)
    except OSError as exc:
        raise Refusal(f"cannot prepare output dir {output_dir}: {exc}") from None
    return root, inputs, output_dir


def _lay_out_scratch(scratch: str, source: str) -> tuple[str, str]:
    """In `scratch`: the job's private dir (home and tmp, the job's, 0700) and its script (root, 0444)."""
    os.chmod(scratch, 0o711)
    private = os.path.join(scratch, secrets.token_hex(16))
    os.mkdir(private, 0o700)
    _chown_to_job(private)
    for sub in ("home", "tmp"):
        os.mkdir(os.path.join(private, sub), 0o700)
        _chown_to_job(os.path.join(private, sub))
    script = os.path.join(scratch, "script.py")
    with open(script, "w", encoding="utf-8", errors="surrogatepass") as fh:
        fh.write(source)
    os.chmod(script, 0o444)
    return private, script


def copy_script(output_dir: str, script: str) -> None:
    """The script, into the outputs before any job code runs, as the score job's evidence of what ran
    (docs/integrity.md): a new file (never one the job placed, nor a link it planted), the launcher's
    and read-only. The job can still remove it; the score job then finds it missing, and its hash,
    which the operator passes, tells an altered copy from the script."""
    path = os.path.join(output_dir, SCRIPT_COPY_NAME)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o444)
    with os.fdopen(fd, "wb") as fh:
        fh.write(script.encode("utf-8", "surrogatepass"))


def _child(job: PreparedJob, out_w: int, err_w: int) -> None:
    """Runs in the forked child; never returns (exec or _exit)."""
    code = EXIT_REFUSED
    try:
        os.setpgid(0, 0)
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.dup2(out_w, 1)
        os.dup2(err_w, 2)
        os.chdir(job.cwd)
        limits = job.spec.limits
        sandbox.lock_down(
            max_file_bytes=limits.file_bytes,
            max_open_files=limits.max_open_files,
            max_processes=job.bounds.processes,
            max_memory_bytes=job.bounds.memory_rlimit,
            network=job.network.mode,
        )
        _check_access(job)
        # -P: neither the script's directory nor the working directory goes on sys.path.
        os.execve(sys.executable, [sys.executable, "-P", job.script], job.env)
    except BaseException as exc:
        try:
            os.write(2, f"{PREFIX}error: sandbox setup failed: {exc}\n".encode(errors="replace"))
        finally:
            os._exit(code)


def _check_access(job: PreparedJob) -> None:
    """As the job's user: outputs writable, inputs readable and not writable."""
    if not os.access(job.output_dir, os.W_OK | os.X_OK):
        raise sandbox.SandboxError(
            f"output dir {job.output_dir} is not writable by uid {os.getuid()} "
            "(is every parent directory searchable?)"
        )
    for name, path in job.inputs.items():
        if not os.access(path, os.R_OK):
            raise sandbox.SandboxError(f"input {name!r} ({path}) is not readable by uid {os.getuid()}")
        if os.access(path, os.W_OK):
            raise sandbox.SandboxError(f"input {name!r} ({path}) is writable by the job, not read-only")


def _exit_code(status: int) -> int:
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        name = signal.Signals(-code).name
        hint = " (a forbidden system call)" if -code == signal.SIGSYS else ""
        _say(f"the job was killed by {name}{hint}")
        return 128 - code
    return code


def _start(job: PreparedJob) -> tuple[int, int, int]:
    """Fork the job into a process group of its own: (its pid, the read ends of its stdout and
    stderr)."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.close(out_r)
        os.close(err_r)
        _child(job, out_w, err_w)
    os.close(out_w)
    os.close(err_w)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also done in the child; whichever runs first wins the race
    return pid, out_r, err_r


def run(job: PreparedJob) -> int:
    """Run the job to its end: relay its output (bounded), forward the signals the launcher gets to
    its process group, stop it once its outputs pass their cap; its exit code."""
    pid, out_r, err_r = _start(job)

    def forward(signum: int, _frame: FrameType | None) -> None:
        with contextlib.suppress(OSError):
            os.killpg(pid, signum)

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, forward)

    cap = job.spec.limits.max_output_bytes
    limits = job.spec.limits
    scratch_cap = limits.max_scratch_bytes
    log = joblog.JobLog(limits.max_log_bytes, job.log_fd, limits.max_log_file_bytes)
    dest = {out_r: sys.stdout.fileno(), err_r: sys.stderr.fileno()}
    sel = selectors.DefaultSelector()
    for fd in dest:
        sel.register(fd, selectors.EVENT_READ)
    status: int | None = None
    over_cap = over_scratch = False
    exited_at = 0.0
    next_scan = time.monotonic() + OUTPUT_SCAN_SECONDS
    try:
        while sel.get_map():
            for key, _ in sel.select(timeout=_POLL_SECONDS):
                fd = int(key.fd)
                data = os.read(fd, _READ_CHUNK)
                if data:
                    log.feed(dest[fd], data)
                else:
                    sel.unregister(fd)
            now = time.monotonic()
            if status is None:
                waited, st = os.waitpid(pid, os.WNOHANG)
                if waited:
                    status, exited_at = st, now
            elif now - exited_at > DRAIN_SECONDS:
                break
            if not (over_cap or over_scratch) and now >= next_scan:
                next_scan = now + OUTPUT_SCAN_SECONDS
                over_cap = tree_size(job.output_dir, cap) > cap
                over_scratch = scratch_cap is not None and tree_size(job.private, scratch_cap) > scratch_cap
                if over_cap or over_scratch:
                    forward(signal.SIGKILL, None)
        if status is None:
            _, status = os.waitpid(pid, 0)
    finally:
        sel.close()
        for fd in dest:
            os.close(fd)
        forward(signal.SIGKILL, None)  # descendants the job left behind
        log.close(sys.stderr.fileno())
    return _outcome(job, _exit_code(status), over_cap=over_cap, over_scratch=over_scratch)


def _outcome(job: PreparedJob, code: int, *, over_cap: bool, over_scratch: bool) -> int:
    """The launcher's exit code: a cap the job passed (its outputs removed where that cap is theirs or
    the scratch's), else the job's own."""
    limits = job.spec.limits
    cap = limits.max_output_bytes
    scratch_cap = limits.max_scratch_bytes
    if over_cap or tree_size(job.output_dir, cap) > cap:
        clear_outputs(job.output_dir)
        _say(f"error: the job's outputs passed max_output_bytes ({cap}); it was stopped, its outputs removed")
        return EXIT_OUTPUT_CAP
    if over_scratch:
        clear_outputs(job.output_dir)
        _say(
            f"error: the job's scratch (HOME and TMPDIR) passed max_scratch_bytes ({scratch_cap}); "
            "it was stopped, its outputs removed"
        )
        return EXIT_SCRATCH_CAP
    at_cap = file_at([job.output_dir, job.private], limits.file_bytes) if code != 0 else None
    if at_cap is not None:
        _say(f"error: {at_cap} reached max_file_bytes ({limits.file_bytes}): a write past it was refused")
        return EXIT_FILE_CAP
    return code


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    env = os.environ if environ is None else environ
    # First thing: from here on the job cannot read this process's environ or memory, even with
    # the same uid.
    sandbox.set_non_dumpable()
    os.umask(0o022)
    if args:
        _say("error: no arguments are taken; the job comes from POSTTRAIN_JOB_SPEC")
        return EXIT_REFUSED
    outcome = None
    if egress.enabled(env):  # before anything of the job, its packages and its network included
        try:
            outcome = egress.verify(env)
        except egress.EgressConfigError as exc:
            _say(f"error: {exc}")
            return EXIT_REFUSED
        egress.write_report(env, outcome, network=None)  # again below once the job's network is set
        if not outcome.verified:
            _say(f"error: {egress.open_reason(outcome)}")
            return egress.EXIT_EGRESS_OPEN
        _say(
            f"egress verified: {outcome.probes} probes closed "
            f"({outcome.rounds} round(s), {outcome.seconds:.1f}s)"
        )
    try:
        job = prepare(env)
    except Refusal as exc:
        _say(f"error: {exc}")
        return EXIT_REFUSED
    if outcome is not None:
        egress.write_report(env, outcome, network=job.network.report())
    _say(job.network.describe())
    _say(job.bounds.describe())
    try:
        return run(job)
    finally:
        shutil.rmtree(job.scratch, ignore_errors=True)
