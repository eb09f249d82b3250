"""`make venv-light` (the tools group and the operator, gateway and cli extras, as the lock resolves
them) installs no torch: what uv would sync for it is read from uv.lock, every platform's markers
included (the walk ignores them, so it can only find more)."""

import re
import tomllib
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
MAKEFILE = (REPO / "Makefile").read_text()
HEAVY = {"torch", "transformers", "trl", "peft", "accelerate"}


def _light_extras() -> list[str]:
    match = re.search(r"^LIGHT_EXTRAS := (.+)$", MAKEFILE, re.MULTILINE)
    assert match, "the Makefile names the light venv's extras in LIGHT_EXTRAS"
    return match.group(1).split()


def _closure(lock: dict[str, Any], roots: list[dict[str, Any]]) -> set[str]:
    packages = {p["name"]: p for p in lock["package"]}
    seen: set[str] = set()
    todo = list(roots)
    while todo:
        dep = todo.pop()
        name = dep["name"]
        extras = dep.get("extra", [])
        key = f"{name}[{','.join(sorted(extras))}]"
        if key in seen:
            continue
        seen.add(key)
        package = packages[name]
        todo += package.get("dependencies", [])
        for extra in extras:
            todo += package.get("optional-dependencies", {}).get(extra, [])
    return {key.split("[")[0] for key in seen}


def test_the_light_venv_resolves_without_torch() -> None:
    lock = tomllib.loads((REPO / "uv.lock").read_text())
    project = next(p for p in lock["package"] if p["name"] == "posttrain-operator")
    assert "--no-default-groups --group tools" in MAKEFILE
    roots = [*project.get("dependencies", []), *project["dev-dependencies"]["tools"]]
    for extra in _light_extras():
        roots += project["optional-dependencies"][extra]
    light = _closure(lock, roots)
    assert {"kopf", "uvicorn", "mcp", "pytest", "mypy", "ruff"} <= light
    assert not HEAVY & light, HEAVY & light
    # The full venv (every extra, the dev group) does hold them: the walk above finds what is there.
    every_extra = [d for deps in project["optional-dependencies"].values() for d in deps]
    full = _closure(lock, [*roots, *project["dev-dependencies"]["dev"], *every_extra])
    assert full >= HEAVY
