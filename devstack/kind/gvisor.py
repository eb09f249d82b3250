"""gVisor for the kind node: `runsc` and `containerd-shim-runsc-v1`, built from the Go module proxy.

gVisor's Go-buildable branch is served by the proxy as `gvisor.dev/gvisor` at a pseudo-version. Both
commands build from a throw-away wrapper module that vendors their packages, so three small patches
can be applied to the vendored copy before compiling (the upstream source is never kept in the
repository: the patches are the exact text replaced, each checked to match once). Each one is what
this node needs and upstream does not do, and changes nothing where upstream already works:

- the shim lowers its own oom_score_adj to -999, which needs CAP_SYS_RESOURCE; on a kernel without it
  (not even in the bounding set) the shim fails to start. It now goes on, as containerd's own shims do
  where they may not lower it.
- the shim answers containerd's `start` with the JSON bootstrap parameters of containerd 1.7+;
  Debian bookworm's containerd 1.6 reads a plain socket address. It now writes the address.
- runsc resolves its own cgroup paths against every cgroup v1 mount of a hierarchy; a kind node
  bind-mounts `/kubelet` and `/kubelet.slice` onto themselves (kind's own entrypoint does too), and
  runsc refused every container ("can't make ../system.slice/containerd.service relative to
  /kubelet.slice"). It now skips a mount whose root does not hold the path.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from devstack.toolchain.build import BuildError, _publish, _require_go, _run_go, log
from devstack.toolchain.paths import GVISOR_VERSION, cache_root, tool_dir

MODULE = "gvisor.dev/gvisor"
# Binary name -> the package that builds it.
COMMANDS = {"runsc": f"{MODULE}/runsc", "containerd-shim-runsc-v1": f"{MODULE}/shim"}
# The name containerd and the RuntimeClass know the runtime by (`runtime_type io.containerd.runsc.v1`).
HANDLER = "runsc"


@dataclass(frozen=True)
class Patch:
    path: str  # in the wrapper module's vendor directory
    old: str
    new: str


PATCHES = (
    Patch(
        f"{MODULE}/pkg/shim/v1/manager.go",
        "if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil {",
        "if err := sys.SetOOMScore(cmd.Process.Pid, oomScoreMax); err != nil && !os.IsPermission(err) {",
    ),
    Patch(
        "github.com/containerd/containerd/v2/pkg/shim/shim.go",
        'return fmt.Errorf("failed to marshal bootstrap params to json: %w", err)\n\t\t}\n',
        'return fmt.Errorf("failed to marshal bootstrap params to json: %w", err)\n\t\t}\n'
        "\t\tdata = []byte(params.Address)\n",
    ),
    Patch(
        f"{MODULE}/runsc/cgroup/cgroup.go",
        "\t\t\t\t\t\tpaths[opt] = relCgroupPath\n",
        '\t\t\t\t\t\tif !strings.HasPrefix(relCgroupPath, "..") {\n'
        "\t\t\t\t\t\t\tpaths[opt] = relCgroupPath\n\t\t\t\t\t\t}\n",
    ),
)


def build_key() -> str:
    """The version and the patches: either changing rebuilds."""
    digest = hashlib.sha256(GVISOR_VERSION.encode())
    for patch in PATCHES:
        digest.update(f"\0{patch.path}\0{patch.old}\0{patch.new}".encode())
    return digest.hexdigest()[:12]


def binaries_dir() -> Path:
    return tool_dir("gvisor", f"{GVISOR_VERSION}-{build_key()}")


def _apply(vendored: Path, patch: Patch) -> None:
    target = vendored / patch.path
    text = target.read_text()
    if text.count(patch.old) != 1:
        raise BuildError(
            f"gVisor {GVISOR_VERSION}: the patch for {patch.path} matches {text.count(patch.old)} times, "
            "not once; the upstream code changed: review the patch against it"
        )
    target.chmod(0o644)
    target.write_text(text.replace(patch.old, patch.new))


def ensure_gvisor() -> Path:
    """The directory holding `runsc` and `containerd-shim-runsc-v1`, built once per key."""
    out = binaries_dir()
    if all(os.access(out / name, os.X_OK) for name in COMMANDS):
        return out
    _require_go("gVisor")
    workdir = cache_root() / "build" / f"gvisor-{GVISOR_VERSION}"
    shutil.rmtree(workdir / "vendor", ignore_errors=True)  # patched before: vendor afresh
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "go.mod").write_text("module local/gvisor-build\n\ngo 1.26.3\n")
    _run_go(["get", "-tool", *(f"{package}@{GVISOR_VERSION}" for package in COMMANDS.values())], workdir,
            "resolve gVisor")  # fmt: skip
    _run_go(["mod", "tidy"], workdir, "go mod tidy (gVisor)")
    _run_go(["mod", "vendor"], workdir, "go mod vendor (gVisor)")
    for patch in PATCHES:
        _apply(workdir / "vendor", patch)
    staging = out.with_name(out.name + ".partial")
    staging.mkdir(parents=True, exist_ok=True)
    ldflags = f"-s -w -X {MODULE}/runsc/version.version={GVISOR_VERSION}"
    for name, package in COMMANDS.items():
        log(f"compiling {name} (gVisor {GVISOR_VERSION})")
        _run_go(
            ["build", "-mod=vendor", "-trimpath", "-ldflags", ldflags, "-o", str(staging / name), package],
            workdir,
            f"compile {name}",
        )
    _publish(staging, out)
    return out
