"""kind clusters for the e2e suite: the node image, the cluster config for this kernel, lifecycle.

The node image is the official `kindest/node` where Docker can pull it, and otherwise the one built
here from Debian packages (devstack/kind/nodeimage.py). The config adds what this kernel needs: without
CAP_SYS_RESOURCE, containerd must not lower oom_score_adj and kubelet and kube-proxy keep theirs at 0.
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import yaml

from devstack.kind import debian, nodeimage
from devstack.kind.images import image_size_mb, require_free_space
from devstack.toolchain.build import BuildError, ensure_go_tool, log

# The official node image for Kubernetes v1.34 (override with KIND_NODE_IMAGE).
OFFICIAL_NODE_IMAGE = "kindest/node:v1.34.4"


def kind_binary() -> Path:
    return ensure_go_tool("kind")


def kernel_lacks_sys_resource() -> bool:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            return not int(line.split()[1], 16) >> 24 & 1
    return False


def node_image() -> str:
    """KIND_NODE_IMAGE if set; else the official image if Docker has or can pull it; else ours."""
    chosen = os.environ.get("KIND_NODE_IMAGE")
    if chosen:
        return chosen
    if debian.image_exists(OFFICIAL_NODE_IMAGE):
        return OFFICIAL_NODE_IMAGE
    pulled = subprocess.run(
        ["docker", "pull", "--quiet", OFFICIAL_NODE_IMAGE], capture_output=True, text=True
    )
    if pulled.returncode == 0:
        return OFFICIAL_NODE_IMAGE
    log(f"cannot pull {OFFICIAL_NODE_IMAGE} ({pulled.stderr.strip()[:160]}); using a node image built here")
    return nodeimage.build_node_image()


def cluster_config(image: str, mounts: dict[str, str] | None = None) -> dict[str, object]:
    """`mounts`: host directory -> path in the node (e.g. a hostPath artifact store both sides see)."""
    patches: list[str] = []
    containerd_patches: list[str] = []
    if image.startswith(nodeimage.REPOSITORY):
        # The home-built node carries etcd at the devstack's version, not kubeadm's default tag.
        patches.append(
            f'kind: ClusterConfiguration\netcd:\n  local:\n    imageTag: "{nodeimage.ETCD_IMAGE_TAG}"\n'
        )
        # Its containerd gives pods cgroupfs paths (containerd-config.toml: what gVisor needs).
        patches.append("kind: KubeletConfiguration\ncgroupDriver: cgroupfs\n")
    if kernel_lacks_sys_resource():
        patches.append("kind: KubeletConfiguration\noomScoreAdj: 0\n")
        patches.append("kind: KubeProxyConfiguration\noomScoreAdj: 0\n")
        containerd_patches.append('[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true\n')
    node: dict[str, object] = {"role": "control-plane", "image": image}
    if mounts:
        node["extraMounts"] = [{"hostPath": host, "containerPath": inside} for host, inside in mounts.items()]
    config: dict[str, object] = {"kind": "Cluster", "apiVersion": "kind.x-k8s.io/v1alpha4", "nodes": [node]}
    if patches:
        config["kubeadmConfigPatches"] = patches
    if containerd_patches:
        config["containerdConfigPatches"] = containerd_patches
    return config


def _kind(*args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(kind_binary()), *args], capture_output=True, text=True, timeout=timeout)


def exists(name: str) -> bool:
    return name in _kind("get", "clusters").stdout.split()


def create(
    name: str, kubeconfig: Path, image: str | None = None, mounts: dict[str, str] | None = None
) -> Path:
    """Create the cluster (one node) and write its kubeconfig; the control plane is Ready after."""
    image = image or node_image()
    kubeconfig.parent.mkdir(parents=True, exist_ok=True)
    config_file = kubeconfig.with_name(f"{name}-kind-config.yaml")
    config_file.write_text(yaml.safe_dump(cluster_config(image, mounts), sort_keys=False))
    if exists(name):
        log(f"deleting the leftover kind cluster {name}")
        delete(name)
    started = time.monotonic()
    log(f"kind create cluster {name} (image {image})")
    proc = _kind(
        "create", "cluster", "--name", name, "--config", str(config_file),
        "--kubeconfig", str(kubeconfig), "--wait", "5m", "--retain",
    )  # fmt: skip
    if proc.returncode != 0:
        logs_dir = kubeconfig.with_name(f"{name}-kind-logs")
        _kind("export", "logs", str(logs_dir), "--name", name)
        delete(name)
        raise BuildError(f"kind create cluster failed (node logs in {logs_dir}):\n{proc.stderr[-4000:]}")
    log(f"cluster {name} up in {int(time.monotonic() - started)}s")
    return kubeconfig


def delete(name: str) -> None:
    _kind("delete", "cluster", "--name", name)


def node_has_image(name: str, image: str) -> bool:
    """Whether the cluster's node already holds `image` (a kept cluster: skip a load of gigabytes)."""
    proc = subprocess.run(
        ["docker", "exec", f"{name}-control-plane", "ctr", "-n", "k8s.io", "images", "ls", "-q"],
        capture_output=True,
        text=True,
    )
    return proc.returncode == 0 and image in proc.stdout.split()


def load_images(name: str, images: list[str]) -> None:
    for image in images:
        if node_has_image(name, image):
            log(f"{image} is already on {name}")
            continue
        # kind saves the image to a temporary archive, and the node's containerd keeps the archive's
        # blobs beside the unpacked layers: about three times the image's size, for a while.
        size = image_size_mb(image) * 1_000_000
        require_free_space(Path(tempfile.gettempdir()), 3 * size, f"kind load docker-image {image}")
        proc = _kind("load", "docker-image", image, "--name", name)
        if proc.returncode != 0:
            raise BuildError(f"kind load docker-image {image} failed: {proc.stderr.strip()[-2000:]}")
        log(f"loaded {image} into {name}")


def host_address(name: str) -> str:
    """The host's address on the kind network: what pods use to reach a server on the host."""
    proc = subprocess.run(
        ["docker", "network", "inspect", "kind"], capture_output=True, text=True, check=True
    )
    for ipam in json.loads(proc.stdout)[0]["IPAM"]["Config"]:
        gateway = ipam.get("Gateway", "")
        if gateway and ":" not in gateway:
            return str(gateway)
    raise BuildError(f"the kind network of {name} has no IPv4 gateway")
