"""Debian root filesystems made with mmdebstrap and imported into Docker, cached by content.

Where no registry is reachable, no base image can be pulled; Debian's packages can be. A root
filesystem is made once per (suite, package list, recipe) and kept as a tarball in the cache; its
Docker image is tagged with the same key, so a warm call does nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from devstack.toolchain.build import BuildError, log
from devstack.toolchain.paths import cache_root

SUITE = "bookworm"
MIRRORS = (
    f"deb http://deb.debian.org/debian {SUITE} main",
    f"deb http://deb.debian.org/debian {SUITE}-updates main",
    f"deb http://deb.debian.org/debian-security {SUITE}-security main",
)
# Documentation and translations are dropped (copyright files stay).
DPKG_OPTIONS = (
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/locale/*",
    "path-exclude=/usr/share/info/*",
)
# Bump when the recipe below changes in a way the package list does not show.
RECIPE = 1

# Python 3.11 (the project's version is bookworm's) for the project's images, plus the iptables
# tools kube-proxy needs, so the Kubernetes component images share this one base layer.
BASE_PACKAGES = (
    "ca-certificates",
    "conntrack",
    "ipset",
    "iptables",
    "libseccomp2",
    "python-is-python3",
    "python3",
    "python3-venv",
)


# Certificate authorities this machine trusts beyond Debian's (a TLS-inspecting egress proxy, a
# company CA). Images made here trust them too, so their builds reach the package registries the
# host reaches; images built from the official base are unaffected.
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")


def local_cas() -> list[Path]:
    return sorted(LOCAL_CA_DIR.glob("*.crt")) if LOCAL_CA_DIR.is_dir() else []


def rootfs_key(packages: Sequence[str], trust_local_cas: bool = False) -> str:
    recipe = json.dumps([SUITE, sorted(packages), MIRRORS, DPKG_OPTIONS, RECIPE])
    digest = hashlib.sha256(recipe.encode())
    if trust_local_cas:
        for ca in local_cas():
            digest.update(ca.name.encode() + ca.read_bytes())
    return digest.hexdigest()[:12]


def rootfs_tarball(name: str, packages: Sequence[str], trust_local_cas: bool = False) -> Path:
    """A cached `mmdebstrap --variant=minbase` tarball with `packages` installed."""
    key = rootfs_key(packages, trust_local_cas)
    out = cache_root() / "rootfs" / f"debian-{SUITE}-{name}-{key}.tar"
    if out.exists():
        return out
    if shutil.which("mmdebstrap") is None:
        raise BuildError("mmdebstrap is needed to make a Debian root filesystem: run `make docker-host`")
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".partial.tar")
    started = time.monotonic()
    log(f"mmdebstrap {SUITE} {name} ({len(packages)} packages; about 2-4 minutes)")
    ca_hooks = []
    if trust_local_cas and local_cas():
        ca_hooks = [
            f"--customize-hook=mkdir -p $1{LOCAL_CA_DIR}",
            *[f"--customize-hook=copy-in {ca} {LOCAL_CA_DIR}" for ca in local_cas()],
            "--customize-hook=chroot $1 update-ca-certificates",
        ]
    cmd = [
        "mmdebstrap",
        "--variant=minbase",
        "--quiet",
        f"--include={','.join(sorted(packages))}",
        *[f"--dpkgopt={option}" for option in DPKG_OPTIONS],
        # No apt lists or caches in the image.
        *ca_hooks,
        "--customize-hook=rm -rf $1/var/lib/apt/lists/* $1/var/cache/apt/*",
        SUITE,
        str(partial),
        *MIRRORS,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"mmdebstrap {name} failed:\n{proc.stderr[-3000:]}")
    partial.replace(out)
    log(f"rootfs {out.name} made in {int(time.monotonic() - started)}s")
    return out


def image_exists(tag: str) -> bool:
    return subprocess.run(["docker", "image", "inspect", tag], capture_output=True).returncode == 0


def remove_other_tags(repository: str, keep: str) -> None:
    """Drop the images of older recipes of `repository`: each tag is a key, so they are never reused.
    KEEP_OLDER_IMAGES=1 keeps them (several checkouts building on one Docker host)."""
    if os.environ.get("KEEP_OLDER_IMAGES") == "1":
        return
    listed = subprocess.run(
        ["docker", "images", "--format", "{{.Repository}}:{{.Tag}}", repository],
        capture_output=True,
        text=True,
    )
    stale = [tag for tag in listed.stdout.split() if tag != keep and not tag.endswith(":<none>")]
    if stale:
        subprocess.run(["docker", "rmi", *stale], capture_output=True)
        log(f"removed older images: {', '.join(stale)}")


def docker_import(tarball: Path, tag: str, changes: Sequence[str] = ()) -> str:
    if image_exists(tag):
        return tag
    cmd = ["docker", "import"]
    for change in changes:
        cmd += ["--change", change]
    proc = subprocess.run([*cmd, str(tarball), tag], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"docker import {tag} failed: {proc.stderr.strip()}")
    log(f"imported {tag}")
    return tag


def base_key() -> str:
    return rootfs_key(BASE_PACKAGES, trust_local_cas=True)


def base_rootfs() -> Path:
    """The base root filesystem: of the project's images here, and of the node's component images."""
    return rootfs_tarball("base", BASE_PACKAGES, trust_local_cas=True)


def base_image() -> str:
    """`localhost/posttrain-debian:<suite>-<key>`: the BASE of the project's images here."""
    tag = f"localhost/posttrain-debian:{SUITE}-{base_key()}"
    if image_exists(tag):
        return tag
    tarball = base_rootfs()
    return docker_import(
        tarball, tag, ["ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"]
    )
