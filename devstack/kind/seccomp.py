"""The Localhost seccomp profile a pods-backend node needs for loopback jobs, made from Docker's own.

A job pod runs as uid 10000 with no capability, and its launcher makes the job's user and network
namespace itself (launcher `network.py`). The runtime's default profile refuses that `unshare`, so
loopback needs a profile of its own on every node. This one is Docker's default profile
(`github.com/moby/profiles/seccomp`, the list containerd's RuntimeDefault is written from) as it
applies to a container holding no capability, with one rule added: `unshare` whose flags are exactly
CLONE_NEWUSER|CLONE_NEWNET. The job itself never gets that call: the launcher's filter refuses every
`unshare` before any job code runs.

Docker's file has conditions (by capability, architecture, kernel) that only Docker reads; the
kubelet hands a Localhost profile to the runtime as an OCI `LinuxSeccomp`, which would drop those
conditions silently and allow what they guard. So the conditions are resolved here, once.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import urllib.request
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from devstack.toolchain.build import BuildError, log
from devstack.toolchain.paths import cache_root

MOBY_SECCOMP_MODULE = "github.com/moby/profiles/seccomp"
MOBY_SECCOMP_VERSION = "v0.3.0"
# Its default.json, as that version holds it: checked on every fetch (the Go proxy's own checksum
# database covers the module zip, which this download does not verify).
MOBY_DEFAULT_SHA256 = "6416b47770785a41ac59073cdc77d9fe98517df2799dc83ef207e622de3053f6"
# Where the kubelet finds it: `<kubelet root>/seccomp/<name>`, named in a pod's `localhostProfile`.
PROFILE_NAME = "posttrain-loopback.json"
UNSHARE_FLAGS = 0x10000000 | 0x40000000  # CLONE_NEWUSER | CLONE_NEWNET
# What Docker allows only to a container holding CAP_SYS_ADMIN, CAP_SYS_MODULE or CAP_SYS_BOOT.
NEVER_ALLOWED = frozenset(
    {"unshare", "setns", "mount", "umount2", "bpf", "init_module", "kexec_load", "reboot"}
)
# Docker's architecture names, for each OCI architecture a node may be.
GO_ARCHES = {"SCMP_ARCH_X86_64": "amd64", "SCMP_ARCH_AARCH64": "arm64"}


def loopback_profile(docker_profile: Mapping[str, Any], arch: str = "SCMP_ARCH_X86_64") -> dict[str, Any]:
    """Docker's profile for a container without capabilities on `arch`, as an OCI LinuxSeccomp, plus
    the launcher's one `unshare`. Pure."""
    if arch not in GO_ARCHES:
        raise ValueError(f"no node architecture {arch!r}; known: {', '.join(sorted(GO_ARCHES))}")
    go_arch = GO_ARCHES[arch]
    (native,) = (a for a in docker_profile["archMap"] if a["architecture"] == arch)
    rules: list[dict[str, Any]] = []
    for rule in docker_profile["syscalls"]:
        includes, excludes = rule.get("includes") or {}, rule.get("excludes") or {}
        if includes.get("caps"):  # allowed only to a container holding these capabilities
            continue
        if includes.get("arches") and go_arch not in includes["arches"]:
            continue
        if go_arch in (excludes.get("arches") or []):
            continue
        # minKernel (4.8) is older than any kernel Kubernetes 1.34 supports; excludes.caps names
        # capabilities this container lacks, so the rule stands.
        oci = {"names": list(rule["names"]), "action": rule["action"]}
        if "errnoRet" in rule:
            oci["errnoRet"] = rule["errnoRet"]
        if rule.get("args"):
            oci["args"] = [dict(arg) for arg in rule["args"]]
        rules.append(oci)
    allowed = {name for rule in rules if rule["action"] == "SCMP_ACT_ALLOW" for name in rule["names"]}
    if allowed & NEVER_ALLOWED:  # a sign the conditions were read wrong: fail the build, not the node
        raise ValueError(f"the profile would allow {sorted(allowed & NEVER_ALLOWED)} to every job")
    rules.append(
        {
            "names": ["unshare"],
            "action": "SCMP_ACT_ALLOW",
            "args": [{"index": 0, "value": UNSHARE_FLAGS, "op": "SCMP_CMP_EQ"}],
        }
    )
    return {
        "defaultAction": docker_profile["defaultAction"],
        "defaultErrnoRet": docker_profile.get("defaultErrnoRet", 1),
        "architectures": [arch, *native.get("subArchitectures", [])],
        "syscalls": rules,
    }


def docker_default_profile() -> dict[str, Any]:
    """`default.json` of the pinned moby profiles module, from the Go module proxy, cached."""
    cached = cache_root() / "assets" / f"moby-seccomp-{MOBY_SECCOMP_VERSION}" / "default.json"
    if not cached.exists():
        url = f"{_go_proxy()}/{MOBY_SECCOMP_MODULE}/@v/{MOBY_SECCOMP_VERSION}.zip"
        try:
            with urllib.request.urlopen(url, timeout=60) as reply:
                archive = zipfile.ZipFile(io.BytesIO(reply.read()))
            data = archive.read(f"{MOBY_SECCOMP_MODULE}@{MOBY_SECCOMP_VERSION}/default.json")
        except (OSError, KeyError, zipfile.BadZipFile) as exc:
            raise BuildError(f"cannot fetch Docker's seccomp profile from {url}: {exc}") from None
        if hashlib.sha256(data).hexdigest() != MOBY_DEFAULT_SHA256:
            raise BuildError(f"{url}: default.json is not the one {MOBY_SECCOMP_VERSION} holds (sha256)")
        cached.parent.mkdir(parents=True, exist_ok=True)
        cached.with_suffix(".part").write_bytes(data)
        cached.with_suffix(".part").rename(cached)
        log(f"fetched Docker's seccomp profile {MOBY_SECCOMP_VERSION}")
    data = cached.read_bytes()
    if hashlib.sha256(data).hexdigest() != MOBY_DEFAULT_SHA256:
        raise BuildError(f"{cached} is not Docker's profile {MOBY_SECCOMP_VERSION}: remove it, fetch again")
    profile: dict[str, Any] = json.loads(data)
    return profile


def _go_proxy() -> str:
    """The first proxy URL GOPROXY names (entries are separated by `,` or `|`; `direct` and `off` are
    not proxies), else the public one."""
    for entry in re.split(r"[,|]", os.environ.get("GOPROXY", "")):
        if entry.startswith(("https://", "http://")):
            return entry.rstrip("/")
    return "https://proxy.golang.org"


def write_loopback_profile(out: Path, arch: str = "SCMP_ARCH_X86_64") -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(loopback_profile(docker_default_profile(), arch), indent=1) + "\n")
    return out
