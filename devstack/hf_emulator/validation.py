"""Validation of `POST /api/jobs/{namespace}` bodies, as strict as the real API's schema.

The rules are those of `docs/hf-jobs-api.md` (from the Hub OpenAPI schema and docs). Where the
real API's behaviour is unknown the emulator is stricter, e.g. unknown top-level keys are refused:
the backend only ever sends what the client builds, so a refusal here is a bug worth seeing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import Any

from devstack.hf_emulator.hardware import FLAVORS

LABEL_RE = re.compile(r"^[a-zA-Z0-9._-]*$")
LABEL_MAX = 100
NETWORK_NAME_RE = re.compile(r"^[a-z0-9-]+$")
# Hub ids: each part starts with an alphanumeric, so ".." can never name a directory outside the store.
REPO_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}/[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
VOLUME_TYPES = ("bucket", "model", "dataset", "space")
DEFAULT_TIMEOUT_SECONDS = 30 * 60  # the server default when the client omits timeoutSeconds

_KNOWN_KEYS = {
    "command",
    "arguments",
    "environment",
    "flavor",
    "secrets",
    "timeoutSeconds",
    "attempts",
    "labels",
    "volumes",
    "expose",
    "ssh",
    "network",
    "dockerImage",
    "spaceId",
    "resourceGroupId",
    "arch",
}


class SpecError(ValueError):
    """A 400: the message is returned to the client as `{"error": message}`."""


@dataclass(frozen=True)
class VolumeSpec:
    type: str
    source: str
    mount_path: str
    revision: str | None = None
    read_only: bool | None = None
    path: str | None = None

    def to_wire(self) -> dict[str, Any]:
        data: dict[str, Any] = {"type": self.type, "source": self.source, "mountPath": self.mount_path}
        if self.revision is not None:
            data["revision"] = self.revision
        data["readOnly"] = self.type != "bucket" or bool(self.read_only)
        if self.path is not None:
            data["path"] = self.path
        return data


@dataclass(frozen=True)
class JobSpec:
    command: list[str]
    flavor: str
    arguments: list[str] = field(default_factory=list)
    environment: dict[str, str] = field(default_factory=dict)
    secrets: dict[str, str] = field(default_factory=dict)
    timeout_seconds: int = DEFAULT_TIMEOUT_SECONDS
    attempts: int | None = None
    labels: dict[str, str] = field(default_factory=dict)
    volumes: list[VolumeSpec] = field(default_factory=list)
    docker_image: str | None = None
    space_id: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # echoed as sent: expose, ssh, network, ...


def _str_list(body: dict[str, Any], key: str, *, min_items: int) -> list[str]:
    value = body.get(key, [])
    if not isinstance(value, list) or len(value) < min_items:
        raise SpecError(f"{key} must be an array with at least {min_items} item(s)")
    for item in value:
        if not isinstance(item, str) or (key == "command" and not item):
            raise SpecError(f"{key} items must be non-empty strings")
    return list(value)


def _str_map(body: dict[str, Any], key: str) -> dict[str, str]:
    value = body.get(key, {})
    if not isinstance(value, dict):
        raise SpecError(f"{key} must be an object")
    for k, v in value.items():
        if not k or not isinstance(v, str):
            raise SpecError(f"{key}.{k} must be a string")
    return dict(value)


def _int(body: dict[str, Any], key: str, minimum: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    # bool is an int subclass; JSON true is not a number.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise SpecError(f"{key} must be an integer >= {minimum}")
    return value


def _labels(body: dict[str, Any]) -> dict[str, str]:
    labels = _str_map(body, "labels")
    for k, v in labels.items():
        for what, text in (("key", k), ("value", v)):
            if len(text) > LABEL_MAX or not LABEL_RE.match(text):
                raise SpecError(
                    f"label {what} {text[:120]!r} must be at most {LABEL_MAX} characters of [a-zA-Z0-9._-]"
                )
    return labels


def _relative(path: str, what: str) -> str:
    parts = PurePosixPath(path).parts
    if path.startswith("/") or ".." in parts:
        raise SpecError(f"{what} must be a relative path without '..'")
    return path


def _volumes(body: dict[str, Any]) -> list[VolumeSpec]:
    if "volumes" not in body:
        return []
    raw = body["volumes"]
    if not isinstance(raw, list) or not raw:
        raise SpecError("volumes must be an array with at least 1 item")
    volumes: list[VolumeSpec] = []
    for i, v in enumerate(raw):
        if not isinstance(v, dict):
            raise SpecError(f"volumes[{i}] must be an object")
        unknown = set(v) - {"type", "source", "mountPath", "revision", "readOnly", "path"}
        if unknown:
            raise SpecError(f"volumes[{i}] has unknown keys {sorted(unknown)}")
        vtype = v.get("type", "model")
        source, mount = v.get("source"), v.get("mountPath")
        if vtype not in VOLUME_TYPES:
            raise SpecError(f"volumes[{i}].type must be one of {', '.join(VOLUME_TYPES)}")
        if not isinstance(source, str) or not REPO_ID_RE.match(source):
            raise SpecError(f"volumes[{i}].source must be 'namespace/name'")
        if (
            not isinstance(mount, str)
            or not mount.startswith("/")
            or mount == "/"
            or ".." in mount.split("/")
        ):
            raise SpecError(f"volumes[{i}].mountPath must be an absolute path other than '/'")
        revision, read_only, path = v.get("revision"), v.get("readOnly"), v.get("path")
        if revision is not None and (not isinstance(revision, str) or not revision or vtype == "bucket"):
            raise SpecError(f"volumes[{i}].revision must be a non-empty string (repositories only)")
        if read_only is not None and not isinstance(read_only, bool):
            raise SpecError(f"volumes[{i}].readOnly must be a boolean")
        if path is not None and (not isinstance(path, str) or not path):
            raise SpecError(f"volumes[{i}].path must be a non-empty string")
        if path is not None:
            _relative(path, f"volumes[{i}].path")
        volumes.append(VolumeSpec(vtype, source, mount.rstrip("/"), revision, read_only, path))
    mounts = [v.mount_path for v in volumes]
    for m in mounts:
        # Nested mounts could not be laid out as one tree (and would shadow each other on HF too).
        if mounts.count(m) > 1 or any(o != m and o.startswith(m + "/") for o in mounts):
            raise SpecError(f"mountPath {m} is duplicated or contains another mount")
    return volumes


def _check_extras(body: dict[str, Any]) -> None:
    expose = body.get("expose")
    if expose is not None:
        if not isinstance(expose, dict):
            raise SpecError("expose must be an object")
        ports = expose.get("ports", [])
        public = expose.get("portsPublic", [])
        for p in [*ports, *public]:
            if isinstance(p, bool) or not isinstance(p, int) or not 1 <= p <= 65535:
                raise SpecError("expose ports must be integers in 1..65535")
        if len(ports) > 20:
            raise SpecError("expose.ports must have at most 20 items")
    network = body.get("network")
    if network is not None:
        group = network.get("group") if isinstance(network, dict) else None
        if not isinstance(group, str) or len(group) > 46 or not NETWORK_NAME_RE.match(group):
            raise SpecError("network.group must be at most 46 characters of [a-z0-9-]")
        aliases = network.get("aliases", [])
        if not isinstance(aliases, list) or len(set(aliases)) != len(aliases):
            raise SpecError("network.aliases must be an array of unique names")
        for a in aliases:
            if not isinstance(a, str) or len(a) > 34 or not NETWORK_NAME_RE.match(a):
                raise SpecError("network aliases must be at most 34 characters of [a-z0-9-]")
    if body.get("arch") not in (None, "amd64", "arm64"):
        raise SpecError("arch must be amd64 or arm64")
    rg = body.get("resourceGroupId")
    if rg is not None and (not isinstance(rg, str) or not re.fullmatch(r"[0-9a-f]{24}", rg)):
        raise SpecError("resourceGroupId must be 24 hex characters")


def parse_job_spec(body: object) -> JobSpec:
    if not isinstance(body, dict):
        raise SpecError("the body must be a JSON object")
    unknown = set(body) - _KNOWN_KEYS
    if unknown:
        raise SpecError(f"unknown fields: {', '.join(sorted(unknown))}")
    flavor = body.get("flavor")
    if not isinstance(flavor, str) or not flavor:
        raise SpecError("flavor is required")
    if flavor not in FLAVORS:
        raise SpecError(f"flavor {flavor!r} is not one of {', '.join(FLAVORS)}")
    image, space = body.get("dockerImage"), body.get("spaceId")
    if not (isinstance(image, str) and image) and not (isinstance(space, str) and space):
        raise SpecError("one of dockerImage or spaceId is required")
    _check_extras(body)
    return JobSpec(
        command=_str_list(body, "command", min_items=1),
        arguments=_str_list(body, "arguments", min_items=0),
        environment=_str_map(body, "environment"),
        secrets=_str_map(body, "secrets"),
        flavor=flavor,
        timeout_seconds=_int(body, "timeoutSeconds", 1) or DEFAULT_TIMEOUT_SECONDS,
        attempts=_int(body, "attempts", 1),
        labels=_labels(body),
        volumes=_volumes(body),
        docker_image=image if isinstance(image, str) and image else None,
        space_id=space if isinstance(space, str) and space else None,
        extra={k: body[k] for k in ("expose", "ssh", "network", "resourceGroupId", "arch") if k in body},
    )


# -- the Hub's repository write API (`hub_api.py`) --------------------------------------------------

# A new repo's name, as the Hub allows it: alphanumerics and "-_.", neither starting nor ending with
# "-" or ".", no "--" or "..", at most 96 characters.
REPO_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?$")
# Tags and branches: one path segment of git-safe characters; "/" would make names ambiguous in URLs.
REF_NAME_RE = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9._-]{0,126}[A-Za-z0-9_])?$")
COMMIT_OID_RE = re.compile(r"^[0-9a-f]{40}$")
MAX_REPO_PATH = 1024
_FORBIDDEN_SEGMENTS = (".git", ".cache")  # as the client's FORBIDDEN_FOLDERS


def check_repo_name(name: object) -> str:
    if (
        not isinstance(name, str)
        or not REPO_NAME_RE.match(name)
        or "--" in name
        or ".." in name
        or name.endswith(".git")
    ):
        raise SpecError(
            "repo name must be 1-96 characters of [A-Za-z0-9._-], start and end with an alphanumeric, "
            "and hold no '--' or '..'"
        )
    return name


def check_ref_name(name: object, what: str) -> str:
    if not isinstance(name, str) or not REF_NAME_RE.match(name) or ".." in name or name.endswith(".lock"):
        raise SpecError(f"{what} must be 1-128 characters of [A-Za-z0-9._-] starting with an alphanumeric")
    if COMMIT_OID_RE.match(name):
        raise SpecError(f"{what} must not look like a commit id (40 hex characters)")
    return name


def check_repo_path(path: object, what: str = "path", *, folder: bool = False) -> str:
    """A file's path in a repository: relative, '/'-separated, every segment a real name.

    `folder`: a trailing '/' (how the client marks a folder deletion) is allowed and removed.
    """
    if not isinstance(path, str):
        raise SpecError(f"{what} must be a string")
    if folder and path.endswith("/"):
        path = path[:-1]
    problem = None
    if not path:
        problem = "is empty"
    elif len(path.encode()) > MAX_REPO_PATH:
        problem = f"is longer than {MAX_REPO_PATH} bytes"
    elif path.startswith("/"):
        problem = "is absolute"
    elif "\\" in path or "\0" in path:
        problem = "holds a backslash or NUL"
    else:
        segments = path.split("/")
        if any(s in ("", ".", "..") for s in segments):
            problem = "has an empty, '.' or '..' segment"
        elif any(s in _FORBIDDEN_SEGMENTS for s in segments):
            problem = "lies under a .git/ or .cache/ folder"
        elif any(len(s.encode()) > 255 for s in segments):
            problem = "has a segment longer than 255 bytes"
    if problem is not None:
        raise SpecError(f"{what} {path[:200]!r} {problem}")
    return path
