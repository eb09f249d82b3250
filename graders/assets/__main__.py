"""`python -m graders.assets build [--assets-dir DIR] [--json]`: build or reuse the local task repos."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from graders.assets import default_assets_dir, materialize_assets


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graders.assets")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build every repo the tasks reference (cached)")
    build.add_argument("--assets-dir", type=Path, default=None, help=f"default: {default_assets_dir()}")
    build.add_argument("--json", action="store_true", help="print the repos as JSON on stdout")
    args = parser.parse_args(argv)

    repos = materialize_assets(args.assets_dir, progress=_say)
    if args.json:
        listing = [{**repo.ref.model_dump(), "path": str(repo.path)} for repo in repos]
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
    else:
        for repo in repos:
            sys.stdout.write(f"{repo.ref.kind}\t{repo.ref.repo_id}@{repo.ref.revision}\t{repo.path}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
