"""The OCI archive writer (what containerd imports into the node image) and the kind cluster
config (the patches a kernel without CAP_SYS_RESOURCE needs)."""

from __future__ import annotations

import hashlib
import json
import tarfile
from pathlib import Path

import pytest

from devstack.kind import cluster as kind
from devstack.kind import nodeimage, oci


def test_archive_holds_each_image_under_its_name_with_shared_layers_once(tmp_path: Path) -> None:
    binary = tmp_path / "tool"
    binary.write_bytes(b"\x7fELF fake binary")
    base = oci.file_layer(tmp_path / "base.tar", [oci.FileEntry("/etc/os-release", binary, 0o644)])
    one = oci.file_layer(tmp_path / "one.tar", [oci.FileEntry("/usr/local/bin/one", binary)])
    two = oci.file_layer(tmp_path / "two.tar", [oci.FileEntry("/two", binary)])
    archive = oci.write_archive(
        tmp_path / "images.tar",
        [
            oci.Image("registry.k8s.io/one:v1", [base, one], entrypoint=["/usr/local/bin/one"]),
            oci.Image("registry.k8s.io/two:v2", [base, two]),
        ],
    )
    with tarfile.open(archive) as tar:
        names = tar.getnames()
        index = json.load(tar.extractfile("index.json"))  # type: ignore[arg-type]
        refs = [m["annotations"]["io.containerd.image.name"] for m in index["manifests"]]
        assert refs == ["registry.k8s.io/one:v1", "registry.k8s.io/two:v2"]
        manifest = json.load(tar.extractfile("blobs/sha256/" + index["manifests"][0]["digest"][7:]))  # type: ignore[arg-type]
        config = json.load(tar.extractfile("blobs/sha256/" + manifest["config"]["digest"][7:]))  # type: ignore[arg-type]
        # Every blob is stored once and named by its content's digest.
        for name in names:
            if name.startswith("blobs/"):
                data = tar.extractfile(name).read()  # type: ignore[union-attr]
                assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    blobs = [n for n in names if n.startswith("blobs/")]
    assert len(blobs) == len(set(blobs)) == 3 + 2 * 2  # three layers, a config and a manifest per image
    assert config["config"]["Entrypoint"] == ["/usr/local/bin/one"]
    assert config["rootfs"]["diff_ids"] == [layer["digest"] for layer in manifest["layers"]]
    with tarfile.open(one) as layer:
        member = layer.getmember("usr/local/bin/one")
        assert member.mode == 0o755 and member.uid == 0


def test_kind_config_patches_only_what_the_kernel_and_image_need(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kind, "kernel_lacks_sys_resource", lambda: False)
    official = kind.cluster_config("kindest/node:v1.34.4")
    assert official == {
        "kind": "Cluster",
        "apiVersion": "kind.x-k8s.io/v1alpha4",
        "nodes": [{"role": "control-plane", "image": "kindest/node:v1.34.4"}],
    }
    monkeypatch.setattr(kind, "kernel_lacks_sys_resource", lambda: True)
    ours = kind.cluster_config(f"{nodeimage.REPOSITORY}:v1.34.4-abc")
    patches = "\n".join(ours["kubeadmConfigPatches"])  # type: ignore[arg-type]
    assert f'imageTag: "{nodeimage.ETCD_IMAGE_TAG}"' in patches
    assert "kind: KubeletConfiguration\noomScoreAdj: 0" in patches
    assert "kind: KubeProxyConfiguration\noomScoreAdj: 0" in patches
    assert "restrict_oom_score_adj = true" in ours["containerdConfigPatches"][0]  # type: ignore[index]
