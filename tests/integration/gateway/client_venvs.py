"""Venvs holding other generations of the clients agents and trainers use (an import package can be
installed once per venv, so each generation gets its own). Built from pinned requirements on first use,
then reused: they live in the user cache, keyed by name and version, never in the repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

CACHE = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "posttrain-operator"


def client_venv(name: str, *installs: list[str]) -> Path:
    """The venv `name`, made with one `pip install` per argument list in `installs` (in order), or the
    one already made from exactly these. Returns its directory."""
    venv = CACHE / "venvs" / name
    marker = venv / ".posttrain-ready"
    wanted = json.dumps(installs)
    if marker.exists() and marker.read_text() == wanted:
        return venv
    shutil.rmtree(venv, ignore_errors=True)
    uv = shutil.which("uv") or next(iter(sorted((CACHE / "tools").glob("uv-*/bin/uv"))), None)
    python = venv / "bin" / "python"
    if uv:
        subprocess.run([str(uv), "venv", "-q", "-p", sys.executable, str(venv)], check=True)
        pip = [str(uv), "pip", "install", "-q", "--python", str(python)]
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
    for arguments in installs:
        subprocess.run([*pip, *arguments], check=True, timeout=600)
    marker.write_text(wanted)
    return venv
