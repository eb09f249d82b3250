"""`python -m devstack.hf_emulator --port N --data-dir DIR`: serve until interrupted."""

from __future__ import annotations

import argparse
import signal
import sys
import threading
from pathlib import Path

from devstack.hf_emulator.emulator import DEFAULT_NAMESPACE, DEFAULT_TOKEN, HfEmulator


def _interpreter(choice: str, data_dir: Path) -> str:
    if choice != "auto":
        return choice
    try:
        from posttrain_launcher.host import job_interpreter
    except ImportError:
        return sys.executable
    # As root, this interpreter may sit under a private home the launcher's uid 10000 cannot reach;
    # job_interpreter then builds (once) a venv it can run.
    workdir = data_dir.resolve() / "interpreter"
    workdir.mkdir(parents=True, exist_ok=True)
    data_dir.resolve().chmod(0o711)
    workdir.chmod(0o755)
    return job_interpreter(str(workdir))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m devstack.hf_emulator", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port (printed)")
    parser.add_argument("--data-dir", type=Path, required=True)
    parser.add_argument(
        "--token-file",
        type=Path,
        help=f"a file holding the API token (never on a command line); default: {DEFAULT_TOKEN!r}",
    )
    parser.add_argument("--namespace", default=DEFAULT_NAMESPACE)
    parser.add_argument("--org", action="append", default=[], help="an extra namespace (repeatable)")
    parser.add_argument(
        "--interpreter",
        default="auto",
        help='what "python" in a job command runs; "auto": one the launcher can run as uid 10000',
    )
    parser.add_argument(
        "--max-job-memory",
        type=int,
        metavar="BYTES",
        help="cap on a job's memory whatever its flavor (default: the host's memory)",
    )
    parser.add_argument(
        "--max-job-cpus",
        type=int,
        metavar="CORES",
        help="cap on a job's cores (its CFS quota) whatever its flavor (default: the host's cores)",
    )
    parser.add_argument("--page-size", type=int, default=50)
    parser.add_argument("--scheduling-delay", type=float, default=0.0)
    parser.add_argument(
        "--simulate",
        type=float,
        metavar="SECONDS",
        help="run no processes: every job runs SECONDS then completes",
    )
    parser.add_argument(
        "--repo",
        action="append",
        default=[],
        metavar="KIND:REPO_ID[@REV]=DIR",
        help="register a local directory as a repository, e.g. model:org/m@main=./m (repeatable)",
    )
    return parser


def _token(parser: argparse.ArgumentParser, token_file: Path | None) -> str:
    if token_file is None:
        return DEFAULT_TOKEN
    try:
        token = token_file.read_text(encoding="utf-8").strip()
    except OSError as exc:
        parser.error(f"--token-file: {exc}")
    if not token:
        parser.error(f"--token-file: {token_file} is empty")
    return token


def _register_repos(parser: argparse.ArgumentParser, emulator: HfEmulator, specs: list[str]) -> None:
    for spec in specs:
        try:
            key, source = spec.split("=", 1)
            kind, repo = key.split(":", 1)
            repo_id, _, revision = repo.partition("@")
            emulator.repos.register(kind, repo_id, revision or None, source)
        except (ValueError, OSError) as exc:
            parser.error(f"--repo {spec}: {exc}")


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    token = _token(parser, args.token_file)
    emulator = HfEmulator(
        args.data_dir,
        host=args.host,
        port=args.port,
        token=token,
        namespace=args.namespace,
        orgs=tuple(args.org),
        interpreter=_interpreter(args.interpreter, args.data_dir),
        page_size=args.page_size,
        scheduling_delay=args.scheduling_delay,
        execute=args.simulate is None,
        simulated_runtime=args.simulate or 0.0,
        max_job_memory_bytes=args.max_job_memory,
        max_job_cpu_cores=args.max_job_cpus,
    )
    _register_repos(parser, emulator, args.repo)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    emulator.start()
    print(f"HF_ENDPOINT={emulator.url}", flush=True)
    print(f"namespace={emulator.namespace}", flush=True)  # never the token: logs are read by many
    try:
        done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        emulator.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
