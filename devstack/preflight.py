"""Checks before the tests: jobs run as uid 10000 (the launcher drops to it), so that uid must be able
to reach the checkout and its virtualenv. A checkout under a private home directory fails that."""

from __future__ import annotations

import os
import stat
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def blocked_ancestors(path: Path) -> list[Path]:
    """Directories on the way to `path` that others may not search (no o+x)."""
    return [p for p in [path, *path.parents] if not p.stat().st_mode & stat.S_IXOTH]


def may_change(what: str) -> bool:
    """Whether to change this machine: told to (POSTTRAIN_ASSUME_YES=1, CI=true), or asked on a terminal."""
    if os.environ.get("POSTTRAIN_ASSUME_YES") == "1" or os.environ.get("CI") == "true":
        return True
    if not sys.stdin.isatty():
        return False
    answer = input(f"[preflight] {what}? [y/N] ")
    return answer.strip().lower() in ("y", "yes")


def main() -> int:
    if os.geteuid() != 0:
        return 0  # not root: the launcher cannot drop privileges, and its root-only tests say so
    blocked = blocked_ancestors(REPO)
    if not blocked:
        return 0
    names = ", ".join(str(p) for p in blocked)
    if may_change(f"grant search permission (chmod o+x, not read) on {names}"):
        # Search (not read) permission, so that uid 10000 can reach the repo.
        for directory in blocked:
            directory.chmod(directory.stat().st_mode | stat.S_IXOTH)
        print(f"[preflight] granted o+x on {names} so that job processes (uid 10000) reach the checkout")
        return 0
    print(
        f"[preflight] job processes run as uid 10000 and cannot reach this checkout through {names}.\n"
        f"  Grant search permission (chmod o+x on those directories; POSTTRAIN_ASSUME_YES=1 or\n"
        f"  `make test YES=1` lets this check do it) or clone somewhere else.",
        file=sys.stderr,
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
