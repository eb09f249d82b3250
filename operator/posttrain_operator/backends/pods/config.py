"""Settings of the pods backend: the image, the flavors, and the artifact store every namespace mounts."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# Volume types that every namespace can name, with the strictest Pod Security level that admits them.
STORE_VOLUME_TYPES: dict[str, str] = {
    "csi": "restricted",
    "nfs": "baseline",
    "hostPath": "privileged",  # single-node dev clusters only: baseline forbids hostPath
}
_PREFIX_OK = re.compile(r"^[a-z]([a-z0-9-]{0,14}[a-z0-9])?$")


@dataclass(frozen=True)
class Flavor:
    """What a job of this flavor gets and costs, and where it runs. `cpu`/`memory` are the limits
    (and the requests unless `cpu_request`/`memory_request` ask for less); `queue` is a Kueue
    LocalQueue name, set as the pod's `kueue.x-k8s.io/queue-name` label."""

    cpu: str
    memory: str
    price_micro_usd_per_minute: int
    shm_size: str = "1Gi"  # /dev/shm: a memory-backed volume, counted toward `memory`
    cpu_request: str | None = None
    memory_request: str | None = None
    gpus: int = 0
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    runtime_class_name: str | None = None
    priority_class_name: str | None = None
    queue: str | None = None


@dataclass(frozen=True)
class PodsConfig:
    image: str
    flavors: Mapping[str, Flavor]
    store_volume: Mapping[str, Any]  # one Kubernetes volume source, e.g. {"nfs": {...}}
    store_path: str  # where this process sees the same store
    instance: str = "posttrain-operator"
    namespace_prefix: str = "pt"
    scratch_size: str = "10Gi"
    cancel_grace_seconds: int = 2
    confirm_timeout_seconds: float = 10.0
    request_timeout_seconds: float = 30.0
    max_log_bytes: int = 1 << 20
    max_artifacts_listed: int = 10_000
    # What every job's launcher must find closed before the job starts (egress.py in the launcher):
    # {"name", "host" (an IP: the pod cannot resolve names), "port", "kind": "tcp"|"dns"}, besides
    # what the pod finds itself (API Service, cluster DNS, its node). None: no check.
    egress_probes: tuple[Mapping[str, Any], ...] | None = ()
    egress_bound_seconds: float = 20.0
    # Where the operator fetches the wheels of a job's `packages` (a simple index, PEP 503/691); the
    # pods have no egress, so without one a job with packages is refused. `package_arch`: the nodes'.
    package_index: str | None = None
    package_arch: str = "x86_64"
    max_package_bytes: int = 1 << 30
    # A Localhost seccomp profile on every job node (`<kubelet root>/seccomp/<name>`) that allows the
    # launcher's one unshare: loopback jobs run under it. None: every job is AF_UNIX only.
    loopback_seccomp_profile: str | None = None

    def __post_init__(self) -> None:
        if len(self.store_volume) != 1:
            raise ValueError("the store volume must be exactly one volume source, e.g. {'nfs': {...}}")
        ((kind, source),) = self.store_volume.items()
        if kind not in STORE_VOLUME_TYPES or not isinstance(source, Mapping):
            raise ValueError(
                f"store volume type {kind!r} cannot be mounted from every episode namespace; use one of "
                f"{', '.join(sorted(STORE_VOLUME_TYPES))} (a persistentVolumeClaim is per namespace)"
            )
        if not _PREFIX_OK.match(self.namespace_prefix):
            raise ValueError(f"namespace prefix {self.namespace_prefix!r}: a DNS label of <= 16 characters")
        if not 0 <= self.cancel_grace_seconds <= 5:
            raise ValueError("cancel_grace_seconds must be within 0..5")

    @property
    def store_kind(self) -> str:
        return next(iter(self.store_volume))

    @property
    def pod_security_level(self) -> str:
        return STORE_VOLUME_TYPES[self.store_kind]
