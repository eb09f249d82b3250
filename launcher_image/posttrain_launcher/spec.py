"""The job spec (`POSTTRAIN_JOB_SPEC`, see docs/architecture.md), parsed strictly at the boundary."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import PurePosixPath
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints, ValidationError, model_validator

SPEC_ENV = "POSTTRAIN_JOB_SPEC"
PARTS_ENV = "POSTTRAIN_JOB_SPEC_PARTS"
# One variable's value, in characters: at most 4 bytes each, under Linux's 128 KiB per variable.
SPEC_PART_CHARS = 30_000
ROOT_ENV = "POSTTRAIN_ROOT"

MAX_SPEC_BYTES = 1024 * 1024
MAX_SCRIPT_BYTES = 256 * 1024
MAX_PACKAGES = 32
MAX_PACKAGE_CHARS = 200
MAX_INPUTS = 160  # a score job: base, split, checkpoint, a lineage of 64 and the wheels of 65 jobs
MAX_PATH_CHARS = 1024

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB

# Lower-case only so that two names can never map to the same POSTTRAIN_INPUT_<NAME>.
InputName = Annotated[str, StringConstraints(pattern=r"^[a-z][a-z0-9_]{0,63}$")]
AbsPath = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PATH_CHARS)]
Requirement = Annotated[str, StringConstraints(min_length=1, max_length=MAX_PACKAGE_CHARS)]


class SpecError(ValueError):
    """The job spec is missing or invalid; the launcher refuses the job (exit 2)."""


def _check_abs_path(value: str, what: str) -> None:
    path = PurePosixPath(value)
    if not path.is_absolute() or "\x00" in value:
        raise ValueError(f"{what} must be an absolute path, got {value!r}")
    if ".." in path.parts or str(path) != value:
        raise ValueError(f"{what} must be a normalised path without '..', got {value!r}")


class Limits(BaseModel):
    """Caps applied to one job; defaults are the example values of the job spec (docs/architecture.md)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    max_output_bytes: int = Field(default=1 * GiB, ge=1 * KiB, le=1024 * GiB)
    # Any one file the job writes, anywhere (RLIMIT_FSIZE); default: max_output_bytes.
    max_file_bytes: int | None = Field(default=None, ge=1 * KiB, le=1024 * GiB)
    # The relayed stream (what the backend keeps) and the copy in the outputs (0: none); each keeps
    # its head and its tail past the cap (joblog.py).
    max_log_bytes: int = Field(default=1 * MiB, ge=1 * KiB, le=256 * MiB)
    max_log_file_bytes: int = Field(default=0, ge=0, le=16 * GiB)
    max_open_files: int = Field(default=1024, ge=64, le=65536)
    # The job's HOME and TMPDIR together (its scratch); None: bounded only by where they live.
    max_scratch_bytes: int | None = Field(default=None, ge=1 * MiB, le=1024 * GiB)
    # Lower the flavor's bounds (`bounds.py`); they can never raise them.
    max_processes: int | None = Field(default=None, ge=16, le=1 << 22)
    max_memory_bytes: int | None = Field(default=None, ge=64 * MiB, le=64 * 1024 * GiB)

    @property
    def file_bytes(self) -> int:
        return self.max_output_bytes if self.max_file_bytes is None else self.max_file_bytes


class JobSpec(BaseModel):
    """One job, agent or grader. Build it, then hand `to_json()` to a launcher as POSTTRAIN_JOB_SPEC."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    version: Literal[1] = 1
    role: Literal["agent", "grader"]
    script: str = Field(min_length=1)
    packages: list[Requirement] = Field(default_factory=list, max_length=MAX_PACKAGES)
    inputs: dict[InputName, AbsPath] = Field(default_factory=dict, max_length=MAX_INPUTS)
    output_dir: AbsPath
    limits: Limits = Field(default_factory=Limits)
    # unix: AF_UNIX sockets only. loopback: TCP/UDP on lo too, only in a namespace of lo alone.
    network: Literal["unix", "loopback"] = "unix"

    @model_validator(mode="after")
    def _check(self) -> JobSpec:
        # Byte size, not characters: the cap bounds what the backend stores and ships.
        if len(self.script.encode("utf-8", "surrogatepass")) > MAX_SCRIPT_BYTES:
            raise ValueError(f"script is larger than {MAX_SCRIPT_BYTES} bytes")
        if self.role == "grader" and self.packages:
            raise ValueError("grader jobs take no packages")
        _check_abs_path(self.output_dir, "output_dir")
        if self.output_dir == "/":
            raise ValueError("output_dir must not be '/'")
        out = PurePosixPath(self.output_dir)
        for name, raw in self.inputs.items():
            _check_abs_path(raw, f"inputs.{name}")
            path = PurePosixPath(raw)
            # Overlap would make an input writable or an output read-only.
            if path == out or out in path.parents or path in out.parents:
                raise ValueError(f"inputs.{name} ({raw}) overlaps output_dir ({self.output_dir})")
        return self

    def to_json(self) -> str:
        return self.model_dump_json()


def parse_spec(text: str) -> JobSpec:
    if len(text.encode("utf-8", "surrogatepass")) > MAX_SPEC_BYTES:
        raise SpecError(f"{SPEC_ENV} is larger than {MAX_SPEC_BYTES} bytes")
    try:
        # json.loads first so that strict mode sees JSON types, not pydantic's JSON-mode leniency.
        data = json.loads(text)
        return JobSpec.model_validate(data)
    except json.JSONDecodeError as exc:
        raise SpecError(f"{SPEC_ENV} is not valid JSON: {exc}") from None
    except ValidationError as exc:
        raise SpecError(f"invalid job spec: {_summarise(exc)}") from None


def spec_environment(text: str) -> dict[str, str]:
    """The variables that carry a spec's JSON `text` to the launcher: POSTTRAIN_JOB_SPEC, or, for a
    text past what one variable may hold (Linux refuses to exec with a variable over 128 KiB, and a
    script alone may be 256 KiB), POSTTRAIN_JOB_SPEC_PARTS and POSTTRAIN_JOB_SPEC_<i>, in order."""
    if len(text) <= SPEC_PART_CHARS:
        return {SPEC_ENV: text}
    parts = [text[start : start + SPEC_PART_CHARS] for start in range(0, len(text), SPEC_PART_CHARS)]
    return {PARTS_ENV: str(len(parts)), **{f"{SPEC_ENV}_{index}": part for index, part in enumerate(parts)}}


def load_spec(environ: Mapping[str, str]) -> JobSpec:
    text = environ.get(SPEC_ENV)
    if not text and PARTS_ENV in environ:
        text = _joined_parts(environ)
    if not text:
        raise SpecError(f"{SPEC_ENV} is not set")
    return parse_spec(text)


def _joined_parts(environ: Mapping[str, str]) -> str:
    count = environ[PARTS_ENV]
    if not count.isdigit() or not 0 < int(count) <= MAX_SPEC_BYTES // SPEC_PART_CHARS + 1:
        raise SpecError(f"{PARTS_ENV} is not a part count: {count[:20]!r}")
    missing = [index for index in range(int(count)) if f"{SPEC_ENV}_{index}" not in environ]
    if missing:
        raise SpecError(f"{PARTS_ENV} is {count}, but {SPEC_ENV}_{missing[0]} is not set")
    return "".join(environ[f"{SPEC_ENV}_{index}"] for index in range(int(count)))


def _summarise(exc: ValidationError) -> str:
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "spec"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    return "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")


def host_path(root: str, path: str) -> str:
    """Where the spec's absolute `path` lives on this host, under POSTTRAIN_ROOT `root`."""
    return os.path.join(root, path.lstrip("/")) if root not in ("", "/") else path


def input_env_name(name: str) -> str:
    return "POSTTRAIN_INPUT_" + re.sub(r"[^A-Z0-9_]", "_", name.upper())
