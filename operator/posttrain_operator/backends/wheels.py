"""The agent's packages, resolved and staged by the operator on every backend: a job never reaches a
package index, so before the job exists the operator picks each requirement's wheel from the index
it is configured with (PEP 691 JSON or PEP 503 HTML), checks the index's sha256, reads the wheel's
dependencies and picks theirs the same way, skipping what the job's image holds (and refusing a
requirement the image's version does not meet: packages never replace the image's). It writes the
wheels and `requirements.lock` (each wheel pinned with its sha256) to a directory the backend then
gives the job read-only (pods: the store; HF Jobs: a private dataset repo), and the launcher installs
the lock with no index, hashes required, wheels only, without further resolution.

Resolution takes, for each project, the newest version the first requirement naming it admits, and
refuses a later requirement that version does not meet (no backtracking: the refusal names both, and
the agent can pin). The selection is pure (`wheel_choice`); `stage` does the I/O in a
thread."""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name, parse_wheel_filename

from posttrain_operator.api.models import MAX_INSTALLED_PACKAGES
from posttrain_operator.backends.base import JobRequest, PackagePin
from posttrain_operator.backends.image_packages import provided_packages
from posttrain_operator.backends.wheel_choice import (
    PEP691_JSON_TYPE,
    IndexFile,
    StagingError,
    applying,
    choose,
    declared_requirements,
    parse_index_page,
    parse_requirement,
    target_tags,
)

_MAX_PAGE_BYTES = 8 << 20
_CHUNK_BYTES = 1 << 20
_SCHEMES = ("http", "https")
LOCK_FILE = "requirements.lock"
# Where a job finds its staged wheels (read-only), on every backend; the launcher installs the lock.
WHEELS_MOUNT = "/opt/posttrain-wheels"
MAX_WHEELS = MAX_INSTALLED_PACKAGES  # one job's packages with their dependencies, as status holds them


@dataclass
class Staged:
    pin: PackagePin
    declared: list[Requirement]
    extras: set[str]


def resolve(
    requirements: Sequence[str],
    project_files: Callable[[str], list[IndexFile]],
    fetch: Callable[[IndexFile, int, str], Path],
    *,
    provided: Mapping[str, str],
    arch: str,
    max_bytes: int,
    max_wheels: int = MAX_WHEELS,
) -> tuple[list[Staged], dict[str, str]]:
    """The wheels of `requirements` and of everything they depend on that the image does not hold,
    breadth first; `fetch(file, bytes_left, filename)` writes one to disk as it streams in (never
    whole in memory) and returns its path once its sha256 was checked. Also returns what the job
    asked for that the image holds (name -> its version)."""
    tags = target_tags(arch)
    queue = deque((parse_requirement(text), "the job") for text in requirements)
    chosen: dict[str, Staged] = {}
    held: dict[str, str] = {}
    left = max_bytes
    while queue:
        req, wanted_by = queue.popleft()
        name = canonicalize_name(req.name)
        have = provided.get(name) or (chosen[name].pin.version if name in chosen else None)
        if have is not None:
            if not req.specifier.contains(have, prereleases=True):
                where = "the job's image holds" if name in provided else "an earlier requirement chose"
                raise StagingError(
                    f"{wanted_by} needs {req}, but {where} {name} {have} (packages never replace the "
                    "image's; pin a version that fits both)",
                    transient=False,
                )
            if name in provided:
                if wanted_by == "the job":
                    held[name] = have
            elif not req.extras <= chosen[name].extras:  # extras of a chosen wheel bring more
                staged = chosen[name]
                new = req.extras - staged.extras
                staged.extras |= new
                origin = f"{name}[{','.join(sorted(new))}]"
                already = {str(d) for d in applying(staged.declared, (), arch)}
                more = [d for d in applying(staged.declared, new, arch) if str(d) not in already]
                queue.extend((d, origin) for d in more)
            continue
        if len(chosen) == max_wheels:
            raise StagingError(f"the job's packages need more than {max_wheels} wheels", transient=False)
        file = choose(req, project_files(name), tags)
        filename = Path(file.filename).name  # the index's file name is untrusted: its last component
        wheel = fetch(file, left, filename)
        left -= wheel.stat().st_size
        version = str(parse_wheel_filename(file.filename)[1])
        assert file.sha256 is not None  # fetch checked it
        declared = declared_requirements(wheel)
        pin = PackagePin(name, version, file.sha256.lower())
        chosen[name] = Staged(pin, declared, set(req.extras))
        queue.extend((dep, f"{name} {version}") for dep in applying(declared, req.extras, arch))
    return list(chosen.values()), held


def lock_text(pins: Sequence[PackagePin], held: Mapping[str, str]) -> str:
    """Each staged wheel pinned with its hash; what the job asked for that the image holds, as
    comments pip skips and the launcher reads (packages.check_lock)."""
    lines = [f"{p.name}=={p.version} --hash=sha256:{p.sha256}\n" for p in pins]
    lines += [f"# {name}=={version} (the image's)\n" for name, version in sorted(held.items())]
    return "".join(lines)


def read_lock(text: str) -> list[PackagePin]:
    pins = []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        pinned, _, digest = line.partition(" --hash=sha256:")
        name, _, version = pinned.partition("==")
        pins.append(PackagePin(name, version, digest))
    return pins


@contextlib.contextmanager
def _opened(url: str, timeout: float, accept: str = "*/*") -> Iterator[Any]:
    """A response from the index, its errors (while reading too) as StagingError."""
    # Only the network: an index (or a redirect) naming file:// or ftp:// would read elsewhere.
    if urllib.parse.urlsplit(url).scheme not in _SCHEMES:
        raise StagingError(f"package index: {url!r} is not an http(s) URL", transient=False)
    request = urllib.request.Request(url, headers={"Accept": accept})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            if urllib.parse.urlsplit(response.geturl()).scheme not in _SCHEMES:
                raise StagingError(f"package index: {url} redirected off http(s)", transient=False)
            yield response
    except urllib.error.HTTPError as exc:
        # 404: the project is not on the index, an answer; 5xx and the like may pass.
        raise StagingError(f"package index: GET {url}: HTTP {exc.code}", transient=exc.code >= 500) from None
    except (urllib.error.URLError, OSError) as exc:
        raise StagingError(f"package index unreachable: GET {url}: {exc}", transient=True) from None


def _get(url: str, timeout: float, max_bytes: int, accept: str = "*/*") -> tuple[bytes, str]:
    with _opened(url, timeout, accept) as response:
        data = response.read(max_bytes + 1)
        content_type = response.headers.get("Content-Type", "")
    if len(data) > max_bytes:
        raise StagingError(f"package index: {url} is larger than {max_bytes} bytes", transient=False)
    return data, content_type


def _download(url: str, timeout: float, max_bytes: int, path: Path) -> str:
    """The file at `url` written to `path` in chunks, at most `max_bytes`; its sha256."""
    digest, size = hashlib.sha256(), 0
    with _opened(url, timeout) as response, path.open("wb") as out:
        while chunk := response.read(_CHUNK_BYTES):
            size += len(chunk)
            if size > max_bytes:
                raise StagingError(f"package index: {url} is larger than {max_bytes} bytes", transient=False)
            digest.update(chunk)
            out.write(chunk)
    return digest.hexdigest()


def stage(
    index_url: str,
    requirements: Sequence[str],
    destination: Path,
    *,
    arch: str,
    max_bytes: int,
    timeout: float,
    provided: Mapping[str, str] | None = None,
) -> list[PackagePin]:
    """Resolve `requirements` and download every wheel, with LOCK_FILE, into `destination` (made whole
    or not at all: a directory that exists is an earlier attempt's finished work). Returns the pins."""
    if (destination / LOCK_FILE).is_file():
        return read_lock((destination / LOCK_FILE).read_text())
    if destination.is_dir():  # staged before locks were written: stage it again
        shutil.rmtree(destination)
    base = index_url.rstrip("/") + "/"

    def project_files(name: str) -> list[IndexFile]:
        page_url = urllib.parse.urljoin(base, f"{name}/")
        body, content_type = _get(page_url, timeout, _MAX_PAGE_BYTES, f"{PEP691_JSON_TYPE}, text/html;q=0.5")
        return parse_index_page(body, content_type, page_url)

    def fetch(file: IndexFile, left: int, filename: str) -> Path:
        if file.sha256 is None:
            raise StagingError(f"package index gives no sha256 for {file.filename}", transient=False)
        if _download(file.url, timeout, left, work / filename) != file.sha256.lower():
            raise StagingError(f"{file.filename}: sha256 does not match the index", transient=False)
        return work / filename

    try:  # first: a store the operator cannot write fails before any download
        destination.parent.mkdir(parents=True, exist_ok=True, mode=0o755)
        work = Path(tempfile.mkdtemp(prefix=".staging-", dir=destination.parent))
    except OSError as exc:
        raise StagingError(f"cannot stage wheels on the artifact store: {exc}", transient=False) from None
    try:
        staged, held = resolve(
            requirements, project_files, fetch, provided=provided or {}, arch=arch, max_bytes=max_bytes
        )
        pins = [wheel.pin for wheel in staged]
        (work / LOCK_FILE).write_text(lock_text(pins, held))
        for path in work.iterdir():
            path.chmod(0o444)
        work.chmod(0o755)
        os.rename(work, destination)
    except BaseException:
        shutil.rmtree(work, ignore_errors=True)
        raise
    return pins


def install_env() -> dict[str, str]:
    """What tells the launcher's pip to install the staged lock (every wheel, dependencies included,
    pinned with its sha256) from the mounted wheels, asking no index."""
    lock = f"{WHEELS_MOUNT}/{LOCK_FILE}"
    return {"PIP_NO_INDEX": "1", "PIP_FIND_LINKS": WHEELS_MOUNT, "POSTTRAIN_PACKAGE_LOCK": lock}


def packages_to_stage(request: JobRequest, index: str | None, setting: str) -> list[str]:
    """The job's packages; refused before any call when there is no index to stage them from."""
    packages = [str(p) for p in request.launcher_spec.get("packages") or []]
    if packages and index is None:
        raise StagingError(
            "this job lists packages, but the backend has no package index to stage them from (the "
            f"chart's {setting}): jobs never reach an index themselves",
            transient=False,
        )
    return packages


def stage_job_packages(
    request: JobRequest,
    packages: Sequence[str],
    index: str,
    destination: Path,
    *,
    arch: str,
    max_bytes: int,
    timeout: float,
) -> list[PackagePin]:
    """`stage`, against what the job's image holds."""
    return stage(
        index, packages, destination, arch=arch, max_bytes=max_bytes, timeout=timeout,
        provided=provided_packages(request.environment),
    )  # fmt: skip
