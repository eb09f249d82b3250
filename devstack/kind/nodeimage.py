"""Build a kind node image from Debian packages and Go-built Kubernetes, cached by version.

For machines that cannot pull `kindest/node`. The image is what kind expects of a node: systemd as
PID 1 behind an entrypoint, containerd with CRI, kubelet/kubeadm/kubectl in /usr/bin, the Kubernetes
version in /kind/version, and every image kubeadm needs already in containerd's `k8s.io` namespace
(kube-apiserver, kube-controller-manager, kube-scheduler, kube-proxy, etcd, CoreDNS, pause), so
`kind create cluster` never pulls. Besides runc, containerd knows gVisor's `runsc` handler. Its tag
carries a key over all versions and recipe files: a warm call finds the image and does nothing.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from devstack.kind import debian, gvisor, oci, seccomp
from devstack.toolchain.build import BuildError, ensure_binaries, ensure_go_tool, ensure_node_binaries, log
from devstack.toolchain.paths import (
    COREDNS_VERSION,
    ETCD_VERSION,
    KIND_VERSION,
    KUBE_ROUTER_VERSION,
    KUBERNETES_VERSION,
    PAUSE_VERSION,
    cache_root,
)

NODE_DIR = Path(__file__).resolve().parent / "node"
RUNC_WRAPPER = Path(__file__).resolve().parent / "host" / "runc-without-sys-resource"
REPOSITORY = "localhost/posttrain-kind-node"
# kubeadm's etcd image tag for this etcd (the kind config points kubeadm at it).
ETCD_IMAGE_TAG = f"{ETCD_VERSION.lstrip('v')}-0"

NODE_PACKAGES = (
    "bash",
    "ca-certificates",
    "conntrack",
    "containerd",
    "containernetworking-plugins",
    "dbus",
    "ethtool",
    "iproute2",
    "ipset",
    "iptables",
    "jq",
    "kmod",
    "libseccomp2",
    "mount",
    "nftables",
    "procps",
    "runc",
    "socat",
    "systemd",
    "systemd-sysv",
    "util-linux",
)


def node_image_key() -> str:
    digest = hashlib.sha256()
    for part in (
        KUBERNETES_VERSION,
        ETCD_VERSION,
        COREDNS_VERSION,
        PAUSE_VERSION,
        KUBE_ROUTER_VERSION,
        KIND_VERSION,
        gvisor.build_key(),
        seccomp.MOBY_SECCOMP_VERSION,
        debian.rootfs_key(NODE_PACKAGES),
        debian.base_key(),
    ):
        digest.update(part.encode() + b"\0")
    recipe = sorted(p for p in NODE_DIR.rglob("*") if p.is_file())
    sources = [Path(__file__), Path(oci.__file__), Path(seccomp.__file__), Path(gvisor.__file__)]
    for path in [*recipe, RUNC_WRAPPER, *sources]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


def node_image_tag() -> str:
    return f"{REPOSITORY}:{KUBERNETES_VERSION}-{node_image_key()}"


def component_archive() -> Path:
    """The OCI archive of the images kubeadm runs, cached by key."""
    out = cache_root() / "node-images" / f"components-{KUBERNETES_VERSION}-{node_image_key()}.tar"
    if out.exists():
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    control_plane = ensure_binaries()
    node = ensure_node_binaries()
    base = debian.base_rootfs()
    with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
        work = Path(tmp)

        def binary_layer(name: str, source: Path, path: str) -> Path:
            return oci.file_layer(work / f"{name}.tar", [oci.FileEntry(path, source)])

        images = [
            oci.Image(
                f"registry.k8s.io/{name}:{KUBERNETES_VERSION}",
                [base, binary_layer(name, directory / name, f"/usr/local/bin/{name}")],
            )
            for name, directory in (
                ("kube-apiserver", control_plane),
                ("kube-controller-manager", control_plane),
                ("kube-scheduler", node),
                ("kube-proxy", node),
            )
        ]
        images.append(
            oci.Image(
                f"registry.k8s.io/etcd:{ETCD_IMAGE_TAG}",
                [base, binary_layer("etcd", control_plane / "etcd", "/usr/local/bin/etcd")],
            )
        )
        images.append(
            oci.Image(
                f"registry.k8s.io/coredns/coredns:{COREDNS_VERSION}",
                [base, binary_layer("coredns", ensure_go_tool("coredns"), "/coredns")],
                entrypoint=["/coredns"],
            )
        )
        # The chart's `helm test` Pod runs kubectl from this image.
        images.append(
            oci.Image(
                f"registry.k8s.io/kubectl:{KUBERNETES_VERSION}",
                [base, binary_layer("kubectl", node / "kubectl", "/usr/local/bin/kubectl")],
                entrypoint=["/usr/local/bin/kubectl"],
            )
        )
        images.append(
            oci.Image(
                f"registry.k8s.io/pause:{PAUSE_VERSION}",
                [binary_layer("pause", ensure_go_tool("pause"), "/pause")],
                entrypoint=["/pause"],
                env=(),
            )
        )
        oci.write_archive(out, images)
    # Archives of older recipes are never used again.
    for stale in out.parent.glob("components-*.tar"):
        if stale != out:
            stale.unlink()
    log(f"component images written: {out.name}")
    return out


def _docker(*args: str, input_path: Path | None = None) -> str:
    stdin = input_path.open("rb") if input_path else None
    try:
        proc = subprocess.run(["docker", *args], stdin=stdin, capture_output=True)
    finally:
        if stdin:
            stdin.close()
    if proc.returncode != 0:
        output = (proc.stdout + proc.stderr).decode(errors="replace")
        raise BuildError(f"docker {' '.join(args[:3])} failed: {output[-3000:]}")
    return proc.stdout.decode(errors="replace").strip()


def build_node_image() -> str:
    """Tag of the node image, built if missing (cold: binaries, rootfs, images; warm: nothing)."""
    tag = node_image_tag()
    if debian.image_exists(tag):
        return tag
    started = time.monotonic()
    node_base = debian.docker_import(
        debian.rootfs_tarball("node", NODE_PACKAGES),
        f"{REPOSITORY}-base:{debian.SUITE}-{debian.rootfs_key(NODE_PACKAGES)}",
    )
    node = ensure_node_binaries()
    archive = component_archive()
    stage = f"{REPOSITORY}-stage:{node_image_key()}"
    with tempfile.TemporaryDirectory() as tmp:
        context = Path(tmp)
        shutil.copytree(NODE_DIR / "files", context / "files")
        (context / "files" / "version").write_text(KUBERNETES_VERSION)
        seccomp.write_loopback_profile(context / "files" / seccomp.PROFILE_NAME)
        (context / "bin").mkdir()
        for source in (
            RUNC_WRAPPER,
            node / "kubelet",
            node / "kubeadm",
            node / "kubectl",
            ensure_go_tool("kube-router"),
            *(gvisor.ensure_gvisor() / name for name in gvisor.COMMANDS),
        ):
            shutil.copy2(source, context / "bin" / source.name)
        log(f"docker build {stage}")
        _docker(
            "build", "--quiet", "--build-arg", f"BASE={node_base}", "-f", str(NODE_DIR / "Dockerfile"),
            "-t", stage, str(context),
        )  # fmt: skip
    # Import the component images into the node's containerd: run it once in a throw-away
    # container of the image, then commit the container as the node image.
    container = _docker(
        "run", "-d", "--entrypoint=sleep", "--tmpfs", "/run", "--tmpfs", "/tmp",
        "--security-opt", "seccomp=unconfined", stage, "infinity",
    )  # fmt: skip
    try:
        _docker("exec", container, "bash", "-c", "nohup containerd >/var/log/containerd.log 2>&1 &")
        _docker(
            "exec", container, "bash", "-c",
            "for i in $(seq 60); do ctr version >/dev/null 2>&1 && exit 0; sleep 1; done; "
            "cat /var/log/containerd.log; exit 1",
        )  # fmt: skip
        log("importing component images into the node's containerd")
        _docker(
            "exec", "-i", container, "ctr", "--namespace=k8s.io", "images", "import", "--no-unpack", "-",
            input_path=archive,
        )  # fmt: skip
        listed = _docker("exec", container, "ctr", "--namespace=k8s.io", "images", "list", "-q").split()
        log("images in the node: " + ", ".join(sorted(n for n in listed if not n.startswith("sha256:"))))
        # Stop containerd and wait for it, so its database is committed at rest.
        _docker(
            "exec", container, "bash", "-c",
            # (`sleep` is PID 1 here and reaps nothing: a zombie containerd has stopped.)
            "pkill -x containerd; for i in $(seq 150); do ps -C containerd -o stat= | grep -qv '^Z' "
            "|| exit 0; sleep 0.2; done; echo containerd did not stop; exit 1",
        )  # fmt: skip
        _docker("exec", container, "rm", "-f", "/var/log/containerd.log")  # not part of the image
        _docker(
            "commit", "--change", 'ENTRYPOINT ["/usr/local/bin/entrypoint", "/sbin/init"]',
            "--change", "CMD []", container, tag,
        )  # fmt: skip
    finally:
        subprocess.run(["docker", "rm", "-f", "-v", container], capture_output=True)
        subprocess.run(["docker", "rmi", stage], capture_output=True)
    log(f"node image {tag} built in {int(time.monotonic() - started)}s")
    debian.remove_other_tags(REPOSITORY, keep=tag)
    return tag
