"""Every version of one object, as `kubectl get --watch` streams it: what a ledger invariant is
checked on (each version any client could have seen, not only the last)."""

from __future__ import annotations

import json
import subprocess
import threading
from typing import Any

from devstack.controlplane import cluster as devcluster
from tests.helpers import Kubectl, kubectl_json, wait_for


class ObjectWatch:
    def __init__(self, cluster: devcluster.ClusterState, namespace: str, kind: str, name: str) -> None:
        self.namespace, self.kind, self.name = namespace, kind, name
        self.versions: list[dict[str, Any]] = []
        self._proc = subprocess.Popen(
            [str(cluster.kubectl()), f"--kubeconfig={cluster.kubeconfig}", "-n", namespace,
             "get", kind, name, "--watch", "-o", "json"],
            stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._proc.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for line in self._proc.stdout:
            buffer += line
            try:
                obj, end = decoder.raw_decode(buffer.strip())
            except json.JSONDecodeError:
                continue
            self.versions.append(obj)
            buffer = buffer.strip()[end:]

    def stop(self, kubectl: Kubectl) -> list[dict[str, Any]]:
        """Once the watch has delivered the object's current version, every version up to it."""
        current = kubectl_json(kubectl, "-n", self.namespace, "get", self.kind, self.name)
        version = current["metadata"]["resourceVersion"]
        wait_for(
            lambda: any(v["metadata"]["resourceVersion"] == version for v in self.versions),
            timeout=60, what=f"the watch of {self.kind}/{self.name} to reach version {version}",
        )  # fmt: skip
        self._proc.terminate()
        self._proc.wait(timeout=10)
        self._thread.join(timeout=10)
        return self.versions
