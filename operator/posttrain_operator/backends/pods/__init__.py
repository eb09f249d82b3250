"""The `pods` backend: every job is a hardened Pod on the operator's own cluster.

Isolation: one namespace per episode, holding a default-deny (ingress and egress) NetworkPolicy that
is created, and verified to be the only policy there, before any pod; the namespace enforces Pod
Security `restricted` (or the strictest level the store's volume type allows), so the API server
itself refuses a pod that lost its hardening.

Storage ("artifact store"): one shared volume laid out as `repos/<kind>/<repo_id>/<revision>` and
`outputs/<prefix>`. A PersistentVolumeClaim cannot serve it: a pod can only mount claims of its own
namespace and every episode has its own, so the store is an inline volume source (NFS, CSI, CephFS,
or hostPath on single-node dev clusters) that every namespace can name. Pods mount only the
sub-paths their `JobRequest` lists: repos and `inputs_from` read-only, their own output prefix
read-write; the store's root is never mounted. The operator mounts the same store at
`store_path`, which is how it prepares a job's output dir (owned by uid 10000, before the pod
exists) and reads artifacts, without a sidecar or a pod exec.

Names are deterministic: the episode namespace from (namespace, episode), the pod from the
idempotency key, so a 409 on create means "adopt the existing pod". Pods cannot carry an owner
reference to the AgentJob (another namespace), so labels and annotations tie them back.
"""

from posttrain_operator.backends.pods.backend import PodsBackend
from posttrain_operator.backends.pods.config import Flavor, PodsConfig

__all__ = ["Flavor", "PodsBackend", "PodsConfig"]
