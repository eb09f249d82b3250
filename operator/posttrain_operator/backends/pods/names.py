"""Names, labels and store paths of the pods backend: deterministic, so a retried create finds its
own earlier object, and bounded, so every one is a valid Kubernetes name or label value."""

from __future__ import annotations

import hashlib
import re

from posttrain_operator.api.rules import EPISODE_LABEL as EPISODE_LABEL
from posttrain_operator.backends.base import BackendError

MANAGED_LABEL = "posttrain.dev/managed-by"
KEY_LABEL = "posttrain.dev/key"
SOURCE_NAMESPACE_LABEL = "posttrain.dev/source-namespace"
JOB_LABEL = "posttrain.dev/agentjob"
# Label values are capped at 63 characters and hashed beyond; annotations keep the exact text.
KEY_ANNOTATION = "posttrain.dev/key"
EPISODE_ANNOTATION = "posttrain.dev/episode"
PREFIX_ANNOTATION = "posttrain.dev/output-prefix"
NETWORK_POLICY = "posttrain-default-deny"
# On every job pod from its creation: a deleted pod stays readable until the backend has read its
# final status (the run times its kubelet reports as it kills it) and its episode's namespace goes.
POD_FINALIZER = "posttrain.dev/pod-final-status"
CONTAINER = "job"
JOB_UID = 10000
SCRATCH_VOLUME, STORE_RO_VOLUME, STORE_RW_VOLUME = "scratch", "store-ro", "store-rw"
SHM_VOLUME = "shm"
REPOS_DIR, OUTPUTS_DIR, WHEELS_DIR = "repos", "outputs", "wheels"
_DNS_UNSAFE = re.compile(r"[^a-z0-9-]+")
_LABEL_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")
_LABEL_OK = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?$")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def dns_name(prefix: str, *parts: str) -> str:
    """A DNS label (<= 63) from `parts`: readable head, plus a hash of the exact parts, so that
    ("a-b", "c") and ("a", "b-c") differ and truncation never merges two names."""
    slug = _DNS_UNSAFE.sub("-", "-".join(parts).lower()).strip("-")
    head = f"{prefix}-{slug}"[: 63 - 11].rstrip("-")
    return f"{head}-{_digest(chr(0).join(parts))}"


def label_value(text: str) -> str:
    """`text` if it is a valid label value, else a truncated, hashed stand-in (also valid)."""
    if _LABEL_OK.match(text):
        return text
    head = _LABEL_UNSAFE.sub("-", text)[:52].strip("-_.")
    return f"{head}-{_digest(text)}" if head else _digest(text)


def episode_namespace(prefix: str, namespace: str, episode: str) -> str:
    return dns_name(prefix, namespace, episode)


def pod_name(key: str) -> str:
    return dns_name("job", key)


def relpath(*parts: str) -> str:
    """A store sub-path; refuses anything that could leave the store (the API server refuses '..'
    in subPath too, but the operator also uses these paths on its own mount)."""
    segments = [s for p in parts for s in p.split("/")]
    if any(s in ("", ".", "..") or "\\" in s or "\0" in s for s in segments):
        raise BackendError(f"unsafe store path {'/'.join(parts)!r}", transient=False)
    return "/".join(segments)


def repo_subpath(kind: str, repo_id: str, revision: str) -> str:
    return relpath(REPOS_DIR, kind, repo_id, revision)


def output_subpath(prefix: str) -> str:
    return relpath(OUTPUTS_DIR, prefix)


def episode_wheels_subpath(episode_namespace: str) -> str:
    return relpath(WHEELS_DIR, episode_namespace)


def wheels_subpath(episode_namespace: str, key: str) -> str:
    """The staged wheels of one job, under its episode's directory (removed with the episode)."""
    return relpath(WHEELS_DIR, episode_namespace, pod_name(key))
