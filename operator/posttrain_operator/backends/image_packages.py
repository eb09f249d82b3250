"""What each job image holds: the launcher's packages and what each environment image adds
(image_packages.json, written by `make manifests` from uv.lock and the environments' locks, checked by
`make verify`). A job's requirements are resolved against them and never replace one."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

DATA = Path(__file__).with_name("image_packages.json")


@functools.cache
def _data() -> dict[str, Any]:
    data: dict[str, Any] = json.loads(DATA.read_text())
    return data


def provided_packages(environment: str | None) -> dict[str, str]:
    """name (PEP 503) -> version of every package a job's image holds."""
    held = dict(_data()["launcher"])
    if environment is not None:
        held.update(_data()["environments"].get(environment, {}))
    return held
