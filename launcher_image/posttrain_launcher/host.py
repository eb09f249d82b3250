"""For whoever starts a launcher (the HF Jobs emulator, tests): the command and its environment.

    spec = JobSpec(role="agent", script="print(1)", output_dir="/outputs")
    subprocess.Popen(launcher_command(), env=launcher_env(spec, root=job_tree), start_new_session=True)

Stop a running job with SIGTERM to the launcher (it forwards the signal to the job's process group).
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from collections.abc import Mapping

from .sandbox import JOB_GID, JOB_UID
from .spec import ROOT_ENV, JobSpec, spec_environment


def launcher_command(python: str | None = None) -> list[str]:
    return [python or sys.executable, "-m", "posttrain_launcher"]


def launcher_env(
    spec: JobSpec, *, root: str | None = None, base: Mapping[str, str] | None = None
) -> dict[str, str]:
    """`base` (default: this process's environment) plus the spec and, if given, POSTTRAIN_ROOT.

    The launcher scrubs credential-like variables before the job sees them, so passing the
    caller's environment is safe; pass a smaller `base` to be explicit.
    """
    env = dict(os.environ if base is None else base)
    env.update(spec_environment(spec.to_json()))
    if root is not None:
        env[ROOT_ENV] = root
    else:
        env.pop(ROOT_ENV, None)
    return env


def job_interpreter(workdir: str) -> str:
    """An interpreter that the job's uid can run too, for a launcher started as root on a dev host.

    The launcher execs the job with its own `sys.executable` after dropping to uid 10000. In the
    image that interpreter is world-readable. On a dev machine it may sit under a private home
    (`/root`, mode 0700); then this makes (once) a venv in `workdir` (which uid 10000 must be able
    to search) from the first `pythonX.Y` on PATH that uid 10000 can run, with this environment's
    site-packages added, and returns its interpreter. Start the launcher with what it returns.
    """
    if os.geteuid() != 0 or _job_can_run(sys.executable):
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    venv = os.path.join(workdir, f"job-{version}")
    python = os.path.join(venv, "bin", "python")
    if os.path.exists(python) and _job_can_run(python):
        return python
    for folder in os.environ.get("PATH", "").split(os.pathsep):
        base = os.path.join(folder, version)
        if os.path.isfile(base) and _job_can_run(base):
            break
    else:
        raise RuntimeError(f"no {version} on PATH that uid {JOB_UID} can run")
    subprocess.run([base, "-m", "venv", "--without-pip", "--clear", venv], check=True, timeout=120)
    site_dir = sysconfig.get_paths()["purelib"]
    pth = os.path.join(sysconfig.get_paths(vars={"base": venv, "platbase": venv})["purelib"], "_host.pth")
    with open(pth, "w", encoding="utf-8") as fh:
        # addsitedir (not a bare path line) so that the .pth files there, editable installs, apply.
        fh.write(f"import site; site.addsitedir({site_dir!r})\n")
    if not _job_can_run(python):
        raise RuntimeError(f"uid {JOB_UID} cannot run {python}; is {workdir} searchable by it?")
    return python


def _job_can_run(python: str) -> bool:
    probe = [python, "-c", "import json, encodings.idna"]
    try:
        proc = subprocess.run(
            probe, user=JOB_UID, group=JOB_GID, extra_groups=[], capture_output=True, timeout=60, cwd="/"
        )
    except (OSError, subprocess.SubprocessError):
        return False
    return proc.returncode == 0
