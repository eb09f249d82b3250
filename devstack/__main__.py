"""`python -m devstack build | cluster up|down|status|env | stack up|down|status | token NS SA OUT
| images [NAME...] | node-image`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from devstack import stack
from devstack.controlplane import cluster
from devstack.kind.seccomp import GO_ARCHES
from devstack.toolchain.build import BuildError, ensure_binaries


def _require_state(name: str) -> cluster.ClusterState:
    state = cluster.load_state(name)
    if state is None:
        raise cluster.ClusterError(
            f"cluster {name!r} is not running; start it with `python -m devstack cluster up`"
        )
    return state


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="devstack", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("build", help="build or reuse the cached control-plane binaries")
    cl = sub.add_parser("cluster", help="manage the local control plane")
    cl.add_argument("action", choices=["up", "down", "status", "env"])
    cl.add_argument("--name", default="default")
    cl.add_argument("--apiserver-port", type=int)
    cl.add_argument("--etcd-port", type=int)
    st = sub.add_parser("stack", help="the whole system: cluster, HF Jobs emulator, operator, gateway")
    st.add_argument("action", choices=["up", "down", "status"])
    tok = sub.add_parser("token", help="write a kubeconfig for a ServiceAccount (TokenRequest)")
    tok.add_argument("namespace")
    tok.add_argument("service_account")
    tok.add_argument("output", type=Path)
    tok.add_argument("--name", default="default")
    img = sub.add_parser("images", help="build (or find up to date) the project's images; prints their tags")
    img.add_argument("names", nargs="*", metavar="NAME", help="operator, launcher, env-NAME (default: all)")
    lock = sub.add_parser("env-lock", help="resolve environment images' requirements.lock files")
    lock.add_argument("names", nargs="*", metavar="NAME", help="environments/NAME (default: all)")
    lock.add_argument("--uv", required=True, help="the uv binary to resolve with")
    pkgs = sub.add_parser("image-packages", help="the operator's list of what each job image holds")
    pkgs.add_argument("--check", action="store_true", help="fail if the file is out of date")
    sub.add_parser("node-image", help="the kind node image: official where pullable, else built here")
    prof = sub.add_parser("seccomp-profile", help="job nodes' Localhost seccomp profile for loopback jobs")
    prof.add_argument("output", type=Path, help="where to write it (install: <kubelet root>/seccomp/<name>)")
    prof.add_argument("--arch", default="SCMP_ARCH_X86_64", choices=sorted(GO_ARCHES))
    return parser


def _images(names: list[str], parser: argparse.ArgumentParser) -> int:
    from devstack.kind import environments, images

    known = dict(images.IMAGES)
    known.update((f"env-{n}", environments.environment_image(n)) for n in environments.environment_names())
    unknown = set(names) - set(known)
    if unknown:
        parser.error(f"unknown image {sorted(unknown)}; choose from {sorted(known)}")
    base = images.choose_base()
    for name in names or list(known):
        tag = images.build(known[name], base)
        print(f"{name:10} {tag}  {images.image_size_mb(tag)} MB")
    return 0


def _env_lock(names: list[str], uv: str, parser: argparse.ArgumentParser) -> int:
    from devstack.kind import environments

    known = environments.environment_names()
    if set(names) - set(known):
        parser.error(f"unknown environment {sorted(set(names) - set(known))}; choose from {known}")
    for name in names or known:
        print(environments.write_lock(name, uv))
    return 0


def _stack(action: str) -> int:
    if action == "up":
        running_stack = stack.up()
        episode, token = stack.new_episode(running_stack)
        print(stack.describe(running_stack))
        print(f"episode            {stack.DEMO_NAMESPACE}/{episode} (t0_artifact)")
        print(f"agent token        {token}")
    elif action == "down":
        stack.down()
        print("stack stopped and cleaned up")
    else:
        running = stack.load()
        if running is None:
            print("the stack is not running")
            return 1
        print(stack.describe(running))
        for name, pid in running.pids.items():
            print(f"{name:18} pid {pid:>7}  {'running' if cluster.is_alive(pid) else 'NOT RUNNING'}")
    return 0


def _cluster(args: argparse.Namespace) -> int:
    if args.action == "up":
        state = cluster.up(args.name, apiserver_port=args.apiserver_port, etcd_client_port=args.etcd_port)
        print(f"export KUBECONFIG={state.kubeconfig}")
    elif args.action == "down":
        cluster.down(args.name)
        print(f"cluster {args.name!r} stopped and cleaned up")
    elif args.action == "status":
        state = _require_state(args.name)
        status = cluster.component_status(state)
        for component, alive in status.items():
            print(f"{component:26} pid {state.pids[component]:>7}  {'running' if alive else 'NOT RUNNING'}")
        print(f"server {state.server}\nkubeconfig {state.kubeconfig}")
        return 0 if all(status.values()) else 1
    else:  # env
        state = _require_state(args.name)
        print(f"export KUBECONFIG={state.kubeconfig}")
        print(f"export PATH={state.bin_dir}:$PATH")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "build":
            print(ensure_binaries())
            return 0
        if args.command == "images":
            return _images(args.names, parser)
        if args.command == "env-lock":
            return _env_lock(args.names, args.uv, parser)
        if args.command == "image-packages":
            from devstack.kind import environments

            if environments.write_image_packages(check=args.check):
                return 0
            stale = environments.IMAGE_PACKAGES
            print(f"devstack: {stale} is out of date: run make manifests", file=sys.stderr)
            return 1
        if args.command == "node-image":
            from devstack.kind import cluster as kind

            print(kind.node_image())
            return 0
        if args.command == "seccomp-profile":
            from devstack.kind.seccomp import write_loopback_profile

            print(write_loopback_profile(args.output, args.arch))
            return 0
        if args.command == "stack":
            return _stack(args.action)
        if args.command == "token":
            state = _require_state(args.name)
            print(
                cluster.mint_service_account_kubeconfig(
                    state, args.namespace, args.service_account, args.output
                )
            )
            return 0
        return _cluster(args)
    except (cluster.ClusterError, BuildError) as exc:
        print(f"devstack: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
