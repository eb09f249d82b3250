"""Environment images: the launcher's image plus the packages a kind of task needs, locked by hash.

Each environment is a directory `environments/<name>/` with `requirements.in` (the packages it adds,
pinned), `requirements.lock` (their whole closure beyond what the launcher's image holds, each pinned
with its sha256, resolved against the launcher's own lock) and a Dockerfile built FROM the launcher's
image. `python -m devstack env-lock NAME` (`make env-locks`) writes the lock; the image is built with
the others (`make images`), its tag keyed by the launcher's tag and its own files.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from devstack.kind.images import LAUNCHER, REPO_ROOT, ProjectImage
from devstack.toolchain.build import BuildError, log

ENVIRONMENTS_DIR = REPO_ROOT / "environments"
# The extras the launcher's image installs (launcher_image/Dockerfile).
LAUNCHER_EXTRAS = ("launcher", "graders")
PROJECT = "posttrain-operator"
PYTHON_VERSION = "3.11"
PLATFORM = "x86_64-manylinux_2_28"


def environment_image(name: str) -> ProjectImage:
    return ProjectImage(
        f"env-{name}",
        f"localhost/posttrain-env-{name}",
        f"environments/{name}/Dockerfile",
        (f"environments/{name}",),
        build_space_gb=4,
        built_on=LAUNCHER,
    )


def environment_names() -> list[str]:
    return sorted(p.parent.name for p in ENVIRONMENTS_DIR.glob("*/Dockerfile"))


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def launcher_packages(lock_file: Path = REPO_ROOT / "uv.lock") -> dict[str, str]:
    """name -> version of every package the launcher's image installs: the closure of the project's
    launcher and graders extras in uv.lock (markers ignored: a superset, which only keeps more out)."""
    packages = {p["name"]: p for p in tomllib.loads(lock_file.read_text())["package"]}
    todo: list[dict[str, Any]] = [{"name": PROJECT, "extra": list(LAUNCHER_EXTRAS)}]
    found: dict[str, str] = {}
    seen: set[tuple[str, str]] = set()
    while todo:
        dependency = todo.pop()
        name = normalized(dependency["name"])
        package = packages[name]
        for extra in ["", *dependency.get("extra", [])]:  # "": the package itself
            if (name, extra) in seen:
                continue
            seen.add((name, extra))
            if extra:
                todo += package.get("optional-dependencies", {}).get(extra, [])
            else:
                todo += package.get("dependencies", [])
        if name != PROJECT:
            found[name] = package["version"]
    return found


IMAGE_PACKAGES = REPO_ROOT / "operator" / "posttrain_operator" / "backends" / "image_packages.json"


def image_packages() -> dict[str, Any]:
    """What each job image holds, for the operator's package resolution: the launcher's packages,
    and what each environment image adds to them."""
    added = {
        name: {p: v for p, (v, _) in lock_entries(ENVIRONMENTS_DIR / name / "requirements.lock").items()}
        for name in environment_names()
    }
    return {"launcher": dict(sorted(launcher_packages().items())), "environments": added}


def write_image_packages(*, check: bool) -> bool:
    """Write (or, `check`, compare) IMAGE_PACKAGES; False when the file differs from its source."""
    text = json.dumps(image_packages(), indent=1, sort_keys=True) + "\n"
    if check:
        return IMAGE_PACKAGES.exists() and IMAGE_PACKAGES.read_text() == text
    IMAGE_PACKAGES.write_text(text)
    return True


def lock_entries(lock: Path) -> dict[str, tuple[str, list[str]]]:
    """name -> (version, sha256 hashes) of a requirements lock written by `write_lock`."""
    entries: dict[str, tuple[str, list[str]]] = {}
    current: str | None = None
    for line in lock.read_text().splitlines():
        pinned = re.match(r"^([A-Za-z0-9_.-]+)==([^ \\]+)", line)
        if pinned:
            current = normalized(pinned.group(1))
            entries[current] = (pinned.group(2), [])
        elif current is not None and "--hash=sha256:" in line:
            entries[current][1].append(line.split("--hash=sha256:")[1].split()[0])
    return entries


def write_lock(name: str, uv: str) -> Path:
    """Resolve `environments/<name>/requirements.in` against the launcher's packages and write the
    part of the closure the launcher's image lacks, with hashes, to its requirements.lock."""
    directory = ENVIRONMENTS_DIR / name
    base = launcher_packages()
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "launcher.txt"
        constraints.write_text("".join(f"{n}=={v}\n" for n, v in sorted(base.items())))
        resolved = Path(tmp) / "resolved.txt"
        proc = subprocess.run(
            [uv, "pip", "compile", str(directory / "requirements.in"), "-c", str(constraints),
             "--generate-hashes", "--python-version", PYTHON_VERSION, "--python-platform", PLATFORM,
             "--no-header", "--no-annotate", "-o", str(resolved)],
            capture_output=True, text=True,
        )  # fmt: skip
        if proc.returncode != 0:
            raise BuildError(f"resolving environment {name!r} failed:\n{proc.stderr[-3000:]}")
        blocks = re.split(r"\n(?=[A-Za-z0-9])", resolved.read_text().strip())
    kept = [b for b in blocks if normalized(b.split("==", 1)[0]) not in base]
    lock = directory / "requirements.lock"
    header = (
        "# Generated by `make env-locks` from requirements.in, against the launcher's packages in\n"
        f"# uv.lock (Python {PYTHON_VERSION}, {PLATFORM}): only what the launcher's image lacks.\n"
        "# Do not edit.\n"
    )
    lock.write_text(header + "\n".join(kept) + "\n")
    log(f"{lock.relative_to(REPO_ROOT)}: {len(kept)} packages beyond the launcher's {len(base)}")
    return lock
