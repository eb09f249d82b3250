"""`python -m graders.assets build [--assets-dir DIR] [--json]`: build or reuse the tasks' repos;
`python -m graders.assets publish --namespace ORG [--revision R]`: and upload them to a Hub;
`python -m graders.assets publish --task T`: upload the repos task T builds, where T pins them;
`python -m graders.assets mirror --task T --store DIR`: fill the pods store with T's repos from a Hub."""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict
from pathlib import Path

from graders.assets import default_assets_dir, materialize_assets
from graders.tasks import LOCAL_ASSETS_REVISION, AssetLocation, UnknownTaskError


def _say(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m graders.assets")
    commands = parser.add_subparsers(dest="command", required=True)
    build = commands.add_parser("build", help="build every repo the tasks reference (cached)")
    publish = commands.add_parser(
        "publish", help="build, then upload to a Hub (HF_ENDPOINT, HF_TOKEN) as private repos, tagged"
    )
    target = publish.add_mutually_exclusive_group(required=True)
    target.add_argument("--namespace", help="the user or organization to publish the local build under")
    target.add_argument("--task", help="publish the repos this task builds, to where it pins them")
    publish.add_argument("--revision", default=LOCAL_ASSETS_REVISION, help="the tag (default: %(default)s)")
    mirror = commands.add_parser(
        "mirror", help="download a task's repos from a Hub (HF_ENDPOINT, HF_TOKEN) into the pods store"
    )
    mirror.add_argument("--task", required=True)
    mirror.add_argument("--store", type=Path, required=True, help="the store's root (its repos/ go below)")
    for command in (build, publish, mirror):
        command.add_argument("--json", action="store_true", help="print the repos as JSON on stdout")
    for command in (build, publish):
        command.add_argument("--assets-dir", type=Path, default=None, help=f"default: {default_assets_dir()}")
    args = parser.parse_args(argv)
    if args.command == "publish" and args.task is not None:
        ignored = {"--revision": args.revision != LOCAL_ASSETS_REVISION, "--assets-dir": args.assets_dir}
        if any(ignored.values()):
            named = ", ".join(flag for flag, given in ignored.items() if given)
            parser.error(f"publish --task publishes where the task pins its repos: {named} does not apply")

    if args.command == "mirror":
        return _mirror(args)
    if args.command == "publish":
        return _publish(args)
    repos = materialize_assets(args.assets_dir, progress=_say)
    if args.json:
        listing = [{**repo.ref.model_dump(), "path": str(repo.path)} for repo in repos]
        sys.stdout.write(json.dumps(listing, indent=2) + "\n")
    else:
        for repo in repos:
            sys.stdout.write(f"{repo.ref.kind}\t{repo.ref.repo_id}@{repo.ref.revision}\t{repo.path}\n")
    return 0


def _mirror(args: argparse.Namespace) -> int:
    from huggingface_hub.errors import HfHubHTTPError  # huggingface_hub is needed only here

    from graders.assets.mirror import MirrorError, mirror

    try:
        mirrored = mirror(args.task, args.store, progress=_say)
    except (MirrorError, RuntimeError, HfHubHTTPError, UnknownTaskError) as exc:  # RuntimeError: the registry
        _say(f"error: {exc}")
        return 1
    if args.json:
        sys.stdout.write(json.dumps([asdict(m) for m in mirrored], indent=2) + "\n")
    for m in [] if args.json else mirrored:
        state = "downloaded" if m.downloaded else "unchanged"
        sys.stdout.write(f"{m.kind}\t{m.repo_id}@{m.revision}\t{m.commit}\t{state}\t{m.path}\n")
    return 0


def _publish(args: argparse.Namespace) -> int:
    from huggingface_hub.errors import HfHubHTTPError  # huggingface_hub is needed only here

    from graders.assets.publish import PublishError, publish, publish_task

    try:
        if args.task is not None:
            published = publish_task(args.task, progress=_say)
        else:
            AssetLocation(namespace=args.namespace, revision=args.revision)  # the chart will take these
            published = publish(args.namespace, args.revision, assets_dir=args.assets_dir, progress=_say)
    except (PublishError, ValueError, RuntimeError, HfHubHTTPError, UnknownTaskError) as exc:
        _say(f"error: {exc}")
        return 1
    if args.json:
        sys.stdout.write(json.dumps([asdict(p) for p in published], indent=2) + "\n")
        return 0
    for p in published:
        sys.stdout.write(f"{p.kind}\t{p.repo_id}@{p.revision}\t{p.commit}\n")
    if args.task is not None:
        return 0
    sys.stdout.write(
        "\nInstall or upgrade the chart with:\n"
        f"  --set tasks.assetsNamespace={args.namespace} --set tasks.assetsRevision={args.revision}\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
