"""The agent's packages: a strict requirement policy, then a wheels-only pip install into the job.

Requirements reach pip as argv, so anything that could be read as an option (`--index-url`, `-e`,
`-r`), a URL, a path, a VCS reference or an environment marker is refused before pip runs. pip then
installs with `--only-binary=:all:` (an sdist would run its build code, as root and with network)
and `--no-deps` (the list is the whole install: bounded, and it never re-downloads what the image
already holds, such as torch, because `--target` ignores installed packages).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Mapping, Sequence

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from .spec import MAX_PACKAGE_CHARS, MAX_PACKAGES, host_path

INSTALL_TIMEOUT_SECONDS = 900
_MAX_ERROR_CHARS = 1500

# name, then optional comma-separated version clauses. No extras (meaningless with --no-deps), no
# `===` (arbitrary strings), no `@`, `;`, `#`, whitespace runs or leading `-`.
_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?"
_CLAUSE = r"(?:==|!=|<=|>=|~=|<|>) ?[A-Za-z0-9][A-Za-z0-9.*+!_-]*"
_ALLOWED = re.compile(rf"{_NAME}(?: ?{_CLAUSE}(?: ?, ?{_CLAUSE})*)?")


class PackagePolicyError(ValueError):
    """A requirement list the launcher refuses (exit 2, before any script runs)."""


class InstallError(RuntimeError):
    """pip could not install the (already accepted) requirements, e.g. no wheel exists."""


def check_requirements(raw: Sequence[str]) -> list[str]:
    """Return the normalised requirement strings to hand to pip, or raise PackagePolicyError."""
    if len(raw) > MAX_PACKAGES:
        raise PackagePolicyError(f"at most {MAX_PACKAGES} packages, got {len(raw)}")
    seen: set[str] = set()
    out: list[str] = []
    for item in raw:
        if len(item) > MAX_PACKAGE_CHARS:
            raise PackagePolicyError(f"requirement longer than {MAX_PACKAGE_CHARS} characters")
        if not _ALLOWED.fullmatch(item):
            raise PackagePolicyError(
                f"requirement {item!r} refused: only 'name' or 'name<op>version[,...]' from the index "
                "(no options, URLs, paths, VCS, extras or markers)"
            )
        try:
            req = Requirement(item)
        except InvalidRequirement as exc:
            raise PackagePolicyError(f"requirement {item!r} is invalid: {exc}") from None
        # The regex already excludes these; the parser is the second opinion.
        if req.url is not None or req.marker is not None or req.extras:
            raise PackagePolicyError(f"requirement {item!r} refused: URL, marker or extras")
        name = canonicalize_name(req.name)
        if name in seen:
            raise PackagePolicyError(f"package {req.name!r} listed twice")
        seen.add(name)
        out.append(f"{name}{req.specifier}")
    return out


# Set by a backend that resolved the job's packages with their dependencies (pods, HF Jobs): a pip
# requirements file pinning every wheel to install with its sha256, beside the staged wheels.
LOCK_ENV = "POSTTRAIN_PACKAGE_LOCK"


def check_lock(requirements: Sequence[str], lock: str) -> None:
    """The backend's lock must pin every package the job asked for, or say that the image holds it
    (a comment line `# name==version (the image's)`, which pip skips)."""
    try:
        with open(lock, encoding="utf-8") as fh:
            pinned = {canonicalize_name(line.lstrip("# ").split("==", 1)[0]) for line in fh if "==" in line}
    except OSError as exc:
        raise InstallError(f"the backend's package lock {lock} cannot be read: {exc}") from None
    missing = sorted({canonicalize_name(Requirement(r).name) for r in requirements} - pinned)
    if missing:
        raise InstallError(f"the backend's package lock does not pin {missing}")


def pip_command(
    requirements: Sequence[str], target: str, python: str | None = None, lock: str | None = None
) -> list[str]:
    """The install of `requirements`, or, where the backend resolved them, of its `lock`."""
    return [
        python or sys.executable,
        "-m",
        "pip",
        "install",
        "--only-binary=:all:",
        "--no-deps",
        "--target",
        target,
        "--no-input",
        "--disable-pip-version-check",
        "--no-warn-script-location",
        "--progress-bar=off",
        # A lock names every wheel with its hash; else `--` ends option parsing for the agent's
        # strings: nothing after it can be read as an option, whatever it looks like.
        *(["--require-hashes", "-r", lock] if lock else ["--", *requirements]),
    ]


def install(requirements: Sequence[str], target: str, environ: Mapping[str, str], root: str = "/") -> None:
    """Install into `target` (created by pip), before the lockdown. With a backend's lock, from its
    mounted wheels and no index; without one, from the index (a backend that gives jobs the network).
    The backend's lock and staged wheels are paths of the job's view (under POSTTRAIN_ROOT `root`)."""
    env = dict(environ)
    env.pop("PYTHONPATH", None)
    # pip reads options from PIP_* too; the operator may set an index mirror, the agent cannot.
    env["PIP_NO_INPUT"] = "1"
    if env.get("PIP_FIND_LINKS"):
        env["PIP_FIND_LINKS"] = host_path(root, env["PIP_FIND_LINKS"])
    lock = env.pop(LOCK_ENV, None)
    if lock:
        lock = host_path(root, lock)
        check_lock(requirements, lock)
    try:
        proc = subprocess.run(
            pip_command(requirements, target, lock=lock),
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=INSTALL_TIMEOUT_SECONDS,
            env=env,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise InstallError(f"pip did not finish within {INSTALL_TIMEOUT_SECONDS} s") from None
    if proc.returncode != 0:
        raise InstallError(_pip_error(proc.stdout + proc.stderr))
    os.chmod(target, 0o755)


def _pip_error(output: str) -> str:
    lines = [ln.strip() for ln in output.splitlines() if ln.strip().startswith("ERROR:")]
    detail = " ".join(lines) or (output.strip().splitlines() or ["no output"])[-1]
    return f"pip failed (wheels only; sdists are refused): {detail}"[:_MAX_ERROR_CHARS]
