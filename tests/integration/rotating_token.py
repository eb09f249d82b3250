"""A ServiceAccount identity whose token rotates, as the kubelet rotates a projected token: a kubeconfig
names a `tokenFile`; `rotate()` swaps a new token into that file and revokes the old one (its bound
Secret deleted, which the API server treats as expiry), then waits until the API server refuses it."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import yaml

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl, wait_for


class RotatingToken:
    def __init__(
        self, cluster: devcluster.ClusterState, kubectl: Kubectl, namespace: str, sa: str, out: Path
    ) -> None:
        self.cluster = cluster
        self.kubectl = kubectl
        self.namespace = namespace
        self.sa = sa
        self.token_file = out / f"{sa}.token"
        self.kubeconfig = out / f"{sa}.kubeconfig"
        self.generation = 0
        self.token = self._mint()
        self.token_file.write_text(self.token)
        admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        self.kubeconfig.write_text(yaml.safe_dump({
            "apiVersion": "v1", "kind": "Config", "current-context": sa,
            "clusters": admin["clusters"],
            "contexts": [{"name": sa, "context": {"cluster": admin["clusters"][0]["name"], "user": sa}}],
            "users": [{"name": sa, "user": {"tokenFile": self.token_file.name}}],
        }))  # fmt: skip

    def _secret(self) -> str:
        return f"{self.sa}-token-{self.generation}"

    def _mint(self) -> str:
        """A token bound to a Secret: deleting the Secret revokes it at once (expiry without waiting)."""
        self.generation += 1
        secret = self._secret()
        self.kubectl("-n", self.namespace, "create", "secret", "generic", secret, "--from-literal=x=1")
        return self.kubectl(
            "-n", self.namespace, "create", "token", self.sa, "--bound-object-kind=Secret",
            f"--bound-object-name={secret}", "--duration=1h",
        ).stdout.strip()  # fmt: skip

    def rotate(self) -> None:
        old, old_secret = self.token, self._secret()
        self.token = self._mint()
        staged = self.token_file.with_suffix(".staged")
        staged.write_text(self.token)
        staged.replace(self.token_file)  # atomically, as the kubelet swaps a projected token
        self.kubectl("-n", self.namespace, "delete", "secret", old_secret)
        wait_for(lambda: self.rejected(old), what="the old token to be refused")

    def rejected(self, token: str) -> bool:
        server = yaml.safe_load(Path(self.cluster.kubeconfig).read_text())["clusters"][0]["cluster"]["server"]
        proc = self.kubectl("get", "--raw", "/api", f"--token={token}", "--kubeconfig=/dev/null",
                            f"--server={server}", "--insecure-skip-tls-verify", check=False)  # fmt: skip
        return proc.returncode != 0 and "Unauthorized" in proc.stderr


@contextmanager
def cluster_admin_with_rotating_token(
    cluster: devcluster.ClusterState, kubectl: Kubectl, namespace: str, sa: str, out: Path
) -> Iterator[RotatingToken]:
    """A ServiceAccount in `namespace` bound to cluster-admin (the test is about tokens, not RBAC)."""
    binding = f"{namespace}-{sa}"
    kubectl("-n", namespace, "create", "serviceaccount", sa)
    kubectl("create", "clusterrolebinding", binding, "--clusterrole=cluster-admin",
            f"--serviceaccount={namespace}:{sa}")  # fmt: skip
    try:
        yield RotatingToken(cluster, kubectl, namespace, sa, out)
    finally:
        kubectl("delete", "clusterrolebinding", binding, check=False)
