"""Build the project's images, tagged by what goes into them, so a warm rebuild is a no-op.

Two images: `posttrain-operator` (operator and gateway, no torch) and `posttrain-launcher` (agent
and grader jobs); and the environment images, built on the launcher's (devstack/kind/environments.py).
Each tag is `<version>-<key>`, the key a hash of the Dockerfile, the lock file and the sources the
image copies, and the base image: when `docker image inspect` finds the tag, there
is nothing to build. The base is the official slim Python image when Docker has it or can pull it,
and otherwise a Debian base made here from Debian's packages (devstack/kind/debian.py).
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devstack.kind import debian
from devstack.toolchain.build import BuildError, log

REPO_ROOT = Path(__file__).resolve().parents[2]
PUBLIC_BASE = "python:3.11.14-slim-bookworm"
VERSION = "0.1.0"


@dataclass(frozen=True)
class ProjectImage:
    name: str
    repository: str
    dockerfile: str
    # What the Dockerfile copies (besides pyproject.toml and uv.lock), relative to the repo root.
    sources: tuple[str, ...]
    # Free space a build needs in Docker's root: the dependency layer is written, then committed.
    build_space_gb: int = 2
    # Built FROM another project image (an environment image on the launcher's), not the Python base.
    built_on: ProjectImage | None = None


OPERATOR = ProjectImage(
    "operator",
    "localhost/posttrain-operator",
    "operator/Dockerfile",
    ("operator/posttrain_operator", "env_gateway", "graders", "tasks"),
)
LAUNCHER = ProjectImage(
    "launcher",
    "localhost/posttrain-launcher",
    "launcher_image/Dockerfile",
    ("launcher_image/posttrain_launcher", "graders", "tasks"),
    build_space_gb=14,  # torch with the CUDA libraries of PyPI's wheel: a 6 GB layer, written twice
)
IMAGES = {image.name: image for image in (OPERATOR, LAUNCHER)}


def _source_files(image: ProjectImage) -> list[Path]:
    files = [REPO_ROOT / image.dockerfile, REPO_ROOT / "pyproject.toml", REPO_ROOT / "uv.lock"]
    for source in image.sources:
        files += sorted(
            p for p in (REPO_ROOT / source).rglob("*") if p.is_file() and "__pycache__" not in p.parts
        )
    return files


def image_key(image: ProjectImage, base: str) -> str:
    digest = hashlib.sha256(base.encode() + b"\0")
    for path in _source_files(image):
        digest.update(str(path.relative_to(REPO_ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def image_tag(image: ProjectImage, base: str) -> str:
    return f"{image.repository}:{VERSION}-{image_key(image, base)}"


def choose_base() -> str:
    """The official slim Python image when Docker has or can pull it, else the home-made base."""
    if debian.image_exists(PUBLIC_BASE):
        return PUBLIC_BASE
    pulled = subprocess.run(["docker", "pull", "--quiet", PUBLIC_BASE], capture_output=True, text=True)
    if pulled.returncode == 0:
        return PUBLIC_BASE
    log(f"cannot pull {PUBLIC_BASE} ({pulled.stderr.strip()[:160]}); using a Debian base made here")
    return debian.base_image()


def build(image: ProjectImage, base: str) -> str:
    """The image's tag, built first if Docker does not have it (and the image it is built on)."""
    if image.built_on is not None:
        base = build(image.built_on, base)
    tag = image_tag(image, base)
    if debian.image_exists(tag):
        log(f"{tag} is up to date")
        return tag
    require_free_space(docker_root(), image.build_space_gb << 30, f"docker build {tag}")
    started = time.monotonic()
    log(f"docker build {tag} (BASE={base})")
    # Host networking: the build's package downloads use the host's resolver and routes.
    proc = subprocess.run(
        [
            "docker",
            "build",
            "--network",
            "host",
            "--build-arg",
            f"BASE={base}",
            "-f",
            str(REPO_ROOT / image.dockerfile),
            "-t",
            tag,
            str(REPO_ROOT),
        ],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise BuildError(f"docker build {tag} failed:\n{(proc.stdout + proc.stderr)[-4000:]}")
    log(f"built {tag} in {int(time.monotonic() - started)}s ({image_size_mb(tag)} MB)")
    debian.remove_other_tags(image.repository, keep=tag)
    return tag


def docker_root() -> Path:
    out = subprocess.run(
        ["docker", "info", "--format", "{{.DockerRootDir}}"], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


def require_free_space(path: Path, needed: int, doing: str) -> None:
    """Fail before a step that would otherwise stop half-way with "no space left on device"."""
    free = shutil.disk_usage(path).free
    if free < needed:
        raise BuildError(
            f"{doing} needs about {needed / 2**30:.0f} GiB free under {path}, and {free / 2**30:.1f} GiB "
            "are: free some (`docker image prune`, `docker system df` shows what Docker holds) and retry"
        )


def image_size_mb(tag: str) -> int:
    out = subprocess.run(
        ["docker", "image", "inspect", "--format", "{{.Size}}", tag],
        capture_output=True,
        text=True,
        check=True,
    )
    return int(out.stdout.strip()) // 1_000_000
