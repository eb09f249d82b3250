"""Install a task plugin's pure-Python package onto a directory of `sys.path`, as pip leaves one,
with no build backend and no network: the package, and a dist-info holding the entry points its
pyproject declares (the task registry finds plugins by entry point). The images' Dockerfiles use it.

    python tasks/install_plugin.py tasks/gsm8k /opt/posttrain
"""

from __future__ import annotations

import shutil
import sys
import tomllib
from pathlib import Path


def install(project: Path, target: Path) -> Path:
    """The dist-info written; the package is `project`'s directory named after the distribution."""
    meta = tomllib.loads((project / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    package = meta["name"].replace("-", "_")
    shutil.copytree(project / package, target / package, ignore=shutil.ignore_patterns("__pycache__"))
    info = target / f"{package}-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: {meta['name']}\nVersion: {meta['version']}\n", encoding="utf-8"
    )
    groups = meta.get("entry-points", {})
    (info / "entry_points.txt").write_text(
        "".join(
            f"[{group}]\n" + "".join(f"{name} = {value}\n" for name, value in points.items()) + "\n"
            for group, points in groups.items()
        ),
        encoding="utf-8",
    )
    return info


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python tasks/install_plugin.py PROJECT_DIR TARGET_DIR")
    sys.stdout.write(f"{install(Path(sys.argv[1]), Path(sys.argv[2]))}\n")
