"""Entry point of the `posttrain` command (and the `kubectl posttrain` plugin)."""

from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    raise SystemExit("posttrain: not implemented yet")
