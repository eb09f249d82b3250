"""The operator+gateway image installs only the project's core dependencies and the `operator` and
`gateway` extras: every third-party module their code imports must be declared there, not merely
arrive as someone else's dependency (mcp 1.x brought httpx along; 2.x does not)."""

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
IMAGE_PACKAGES = [
    REPO / "operator" / "posttrain_operator",
    REPO / "env_gateway",
    REPO / "graders" / "tasks.py",
    REPO / "graders" / "task_model.py",
    REPO / "graders" / "builtin_tasks.py",
]
FIRST_PARTY = {"posttrain_operator", "env_gateway", "graders"}


def _name(requirement: str) -> str:
    return re.split(r"[\s<>=!~;\[]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def _declared() -> set[str]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    return {_name(r) for r in [*project["project"]["dependencies"], *extras["operator"], *extras["gateway"]]}


def _imported_modules() -> set[str]:
    files = [p for root in IMAGE_PACKAGES for p in ([root] if root.is_file() else root.rglob("*.py"))]
    modules: set[str] = set()
    for path in files:
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                modules.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules.add(node.module.split(".")[0])
    return modules - FIRST_PARTY - set(sys.stdlib_module_names)


def test_every_third_party_import_of_the_image_is_declared() -> None:
    distributions = packages_distributions()
    declared = _declared()
    undeclared = {
        module: distributions.get(module, ["?"])
        for module in _imported_modules()
        if not declared & {_name(dist) for dist in distributions.get(module, [module])}
    }
    assert not undeclared, f"imported by the operator or the gateway but not declared: {undeclared}"
