"""Write OCI image-layout archives with the standard library, for images no registry serves.

The node image's component images (kube-apiserver, etcd, pause, ...) are a Debian root filesystem
layer plus one layer with a binary. Writing their archive directly avoids tagging anything in the
host's Docker under registry names; containerd imports the archive and takes each image's name
from the `io.containerd.image.name` annotation. Layers are uncompressed tars (the archive never
leaves the machine), so a layer's digest is also its diff ID.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

LAYER_MEDIA_TYPE = "application/vnd.oci.image.layer.v1.tar"
CONFIG_MEDIA_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_MEDIA_TYPE = "application/vnd.oci.image.manifest.v1+json"


@dataclass(frozen=True)
class FileEntry:
    """A file to put in a layer: its path inside the image and where to read it on the host."""

    path: str
    source: Path
    mode: int = 0o755


@dataclass
class Image:
    """One image: a reference (`registry.k8s.io/pause:3.10.1`), layers and its run config."""

    reference: str
    layers: Sequence[Path]
    entrypoint: Sequence[str] = ()
    env: Sequence[str] = ("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",)
    labels: dict[str, str] = field(default_factory=dict)


def file_layer(out: Path, entries: Sequence[FileEntry]) -> Path:
    """A layer tar holding `entries` (and their parent directories), owned by root."""
    with tarfile.open(out, "w", format=tarfile.PAX_FORMAT) as tar:
        directories: set[str] = set()
        for entry in entries:
            parts = entry.path.strip("/").split("/")[:-1]
            for depth in range(1, len(parts) + 1):
                directory = "/".join(parts[:depth])
                if directory not in directories:
                    directories.add(directory)
                    info = tarfile.TarInfo(directory)
                    info.type = tarfile.DIRTYPE
                    info.mode = 0o755
                    tar.addfile(info)
            info = tarfile.TarInfo(entry.path.strip("/"))
            info.size = entry.source.stat().st_size
            info.mode = entry.mode
            with entry.source.open("rb") as source:
                tar.addfile(info, source)
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


class _Archive:
    """An OCI layout being written into a tar, each blob added once."""

    def __init__(self, tar: tarfile.TarFile) -> None:
        self.tar = tar
        self.blobs: set[str] = set()

    def add_bytes(self, data: bytes) -> dict[str, object]:
        digest = hashlib.sha256(data).hexdigest()
        if digest not in self.blobs:
            info = tarfile.TarInfo(f"blobs/sha256/{digest}")
            info.size = len(data)
            self.tar.addfile(info, io.BytesIO(data))
            self.blobs.add(digest)
        return {"digest": f"sha256:{digest}", "size": len(data)}

    def add_file(self, path: Path, digest: str) -> dict[str, object]:
        size = path.stat().st_size
        if digest not in self.blobs:
            info = tarfile.TarInfo(f"blobs/sha256/{digest}")
            info.size = size
            with path.open("rb") as f:
                self.tar.addfile(info, f)
            self.blobs.add(digest)
        return {"digest": f"sha256:{digest}", "size": size}


def write_archive(out: Path, images: Sequence[Image]) -> Path:
    """One OCI-layout tar with every image in `images`, for `ctr images import`."""
    digests: dict[Path, str] = {}
    for image in images:
        for layer in image.layers:
            if layer not in digests:
                digests[layer] = _sha256(layer)
    partial = out.with_name(out.name + ".partial")
    with tarfile.open(partial, "w") as tar:
        archive = _Archive(tar)
        manifests = []
        for image in images:
            layer_descriptors = [
                {"mediaType": LAYER_MEDIA_TYPE, **archive.add_file(layer, digests[layer])}
                for layer in image.layers
            ]
            config = {
                "architecture": "amd64",
                "os": "linux",
                "config": {
                    "Env": list(image.env),
                    "Entrypoint": list(image.entrypoint) or None,
                    "Labels": image.labels or None,
                },
                "rootfs": {
                    "type": "layers",
                    "diff_ids": [f"sha256:{digests[layer]}" for layer in image.layers],
                },
            }
            manifest = {
                "schemaVersion": 2,
                "mediaType": MANIFEST_MEDIA_TYPE,
                "config": {"mediaType": CONFIG_MEDIA_TYPE, **archive.add_bytes(json.dumps(config).encode())},
                "layers": layer_descriptors,
            }
            tag = image.reference.rsplit(":", 1)[1]
            manifests.append(
                {
                    "mediaType": MANIFEST_MEDIA_TYPE,
                    **archive.add_bytes(json.dumps(manifest).encode()),
                    "annotations": {
                        "io.containerd.image.name": image.reference,
                        "org.opencontainers.image.ref.name": tag,
                    },
                    "platform": {"architecture": "amd64", "os": "linux"},
                }
            )
        for name, data in (
            ("oci-layout", {"imageLayoutVersion": "1.0.0"}),
            ("index.json", {"schemaVersion": 2, "manifests": manifests}),
        ):
            raw = json.dumps(data).encode()
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    shutil.move(partial, out)
    return out
