"""Which wheel, and which dependencies, for the launcher's interpreter: the pure half of staging a
job's packages (`wheels` does the I/O). Nothing here reaches the network; a wheel is read only for its
METADATA, and is untrusted."""

from __future__ import annotations

import email.parser
import json
import urllib.parse
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import InvalidWheelFilename, canonicalize_name, parse_wheel_filename
from packaging.version import Version

from posttrain_operator.backends.base import BackendError

# The launcher image's interpreter: CPython 3.11 on Debian bookworm (glibc 2.36).
PYTHON_VERSION = (3, 11)
PYTHON_FULL_VERSION = "3.11.14"  # the launcher image's default base, python:3.11.14-slim-bookworm
GLIBC = (2, 36)
PEP691_JSON_TYPE = "application/vnd.pypi.simple.v1+json"


class StagingError(BackendError):
    """A requirement has no usable wheel on the index, or the index misbehaved. Not transient when
    the index answered: retrying the same index gives the same answer."""


@dataclass(frozen=True)
class IndexFile:
    filename: str
    url: str
    sha256: str | None
    yanked: bool = False


def target_tags(arch: str) -> list[Tag]:
    """The wheel tags the launcher's pip accepts, most preferred first."""
    platforms = [f"manylinux_{GLIBC[0]}_{minor}_{arch}" for minor in range(GLIBC[1], 16, -1)]
    platforms += [f"manylinux2014_{arch}", f"manylinux2010_{arch}", f"manylinux1_{arch}", f"linux_{arch}"]
    interpreter = f"cp{PYTHON_VERSION[0]}{PYTHON_VERSION[1]}"
    return [
        *cpython_tags(PYTHON_VERSION, platforms=platforms),
        *compatible_tags(PYTHON_VERSION, interpreter=interpreter, platforms=platforms),
    ]


def parse_requirement(text: str) -> Requirement:
    """`name` or `name<op>version[,...]`: what the launcher's policy accepts, nothing more."""
    try:
        req = Requirement(text)
    except InvalidRequirement as exc:
        raise StagingError(f"requirement {text!r} is not valid: {exc}", transient=False) from None
    if req.url is not None or req.marker is not None or req.extras:
        raise StagingError(f"requirement {text!r} refused: URL, marker or extras", transient=False)
    return req


class _Anchors(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.found: list[tuple[str, str, bool]] = []
        self._href: str | None = None
        self._yanked = False
        self._text: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "a":
            values = dict(attrs)
            self._href, self._yanked, self._text = values.get("href"), "data-yanked" in values, []

    def handle_data(self, data: str) -> None:
        if self._href is not None:
            self._text.append(data)

    def handle_endtag(self, tag: str) -> None:
        if tag == "a" and self._href is not None:
            self.found.append((self._href, "".join(self._text).strip(), self._yanked))
            self._href = None


def parse_index_page(body: bytes, content_type: str, page_url: str) -> list[IndexFile]:
    """A project's files from its simple-index page, URLs made absolute."""
    if content_type.split(";")[0].strip() == PEP691_JSON_TYPE:
        files = json.loads(body)["files"]
        return [
            IndexFile(
                str(f["filename"]),
                urllib.parse.urljoin(page_url, str(f["url"])),
                (f.get("hashes") or {}).get("sha256"),
                bool(f.get("yanked")),
            )
            for f in files
        ]
    parser = _Anchors()
    parser.feed(body.decode("utf-8", errors="replace"))
    out = []
    for href, text, yanked in parser.found:
        url, _, fragment = urllib.parse.urljoin(page_url, href).partition("#")
        algorithm, _, digest = fragment.partition("=")
        name = text or url.rsplit("/", 1)[-1]
        out.append(IndexFile(name, url, digest if algorithm == "sha256" else None, yanked))
    return out


def choose(req: Requirement, files: Iterable[IndexFile], tags: Sequence[Tag]) -> IndexFile:
    """The newest version the specifier admits that has a wheel for `tags`, and of its wheels the one
    with the most preferred tag. Yanked files are skipped, as pip skips them for a range."""
    rank = {tag: i for i, tag in enumerate(tags)}
    name = canonicalize_name(req.name)
    best: tuple[Version, int, IndexFile] | None = None
    for file in files:
        if file.yanked or not file.filename.endswith(".whl"):
            continue
        try:
            wheel_name, version, _, wheel_tags = parse_wheel_filename(file.filename)
        except InvalidWheelFilename:
            continue
        preference = min((rank[t] for t in wheel_tags if t in rank), default=None)
        if wheel_name != name or preference is None or not req.specifier.contains(version):
            continue
        if best is None or (version, -preference) > (best[0], -best[1]):
            best = (version, preference, file)
    if best is None:
        raise StagingError(
            f"no wheel of {req} for CPython {PYTHON_VERSION[0]}.{PYTHON_VERSION[1]} on Linux "
            "on the operator's package index (jobs install wheels only)",
            transient=False,
        )
    return best[2]


def marker_environment(arch: str) -> dict[str, str]:
    """PEP 508 marker values of the launcher image's interpreter, every one of them (packaging would
    fill a missing one from the operator's own interpreter)."""
    full = PYTHON_FULL_VERSION
    return {
        "python_version": f"{PYTHON_VERSION[0]}.{PYTHON_VERSION[1]}",
        "python_full_version": full,
        "implementation_version": full,
        "platform_release": "",
        "platform_version": "",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
        "os_name": "posix",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "platform_machine": arch,
        "extra": "",
    }


MAX_METADATA_BYTES = 1 << 20  # a wheel's METADATA, as its zip entry says it unpacks


def declared_requirements(wheel: Path) -> list[Requirement]:
    """Every Requires-Dist of a wheel's METADATA, as declared (markers not yet evaluated). A METADATA
    that would unpack past MAX_METADATA_BYTES is refused unread: the wheel is untrusted."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            info = next(
                i
                for i in archive.infolist()
                if i.filename.count("/") == 1 and i.filename.endswith(".dist-info/METADATA")
            )
            if info.file_size > MAX_METADATA_BYTES:
                raise StagingError(f"a wheel's METADATA unpacks to {info.file_size} bytes", transient=False)
            text = archive.read(info).decode("utf-8", errors="replace")
    except (zipfile.BadZipFile, StopIteration, KeyError, OSError) as exc:
        raise StagingError(f"a wheel without readable METADATA ({exc})", transient=False) from None
    found = []
    for line in email.parser.Parser().parsestr(text).get_all("Requires-Dist") or []:
        try:
            req = Requirement(line)
        except InvalidRequirement as exc:
            message = f"a wheel declares an invalid dependency {line!r}: {exc}"
            raise StagingError(message, transient=False) from None
        if req.url is not None:
            message = f"dependency {line!r} is a URL: only the index's wheels are staged"
            raise StagingError(message, transient=False)
        found.append(req)
    return found


def applying(declared: Iterable[Requirement], extras: Iterable[str], arch: str) -> list[Requirement]:
    """The declared dependencies that apply to the launcher's interpreter with `extras` asked for."""
    environment = marker_environment(arch)
    wanted = ["", *extras]
    return [
        req
        for req in declared
        if req.marker is None or any(req.marker.evaluate({**environment, "extra": e}) for e in wanted)
    ]
