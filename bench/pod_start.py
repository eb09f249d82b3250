"""Pod start latency of the chart's operator and gateway on a cluster with a node.

    python bench/pod_start.py --kubeconfig KUBECONFIG [--namespace posttrain-e2e] [--rounds 5]

Needs the chart installed, e.g. `E2E_KEEP_CLUSTER=1 make e2e` leaves the kind cluster and its
release in place (delete it afterwards with `kind delete cluster --name posttrain-e2e`). Each round
runs `kubectl rollout restart` on one Deployment and polls until a pod created after the restart is
Ready. Images are already on the node, so this is scheduling, container start, the process's own
start-up and the first passing readiness probe. The phases come from the pod's own timestamps
(whole seconds); the total is measured here.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from devstack.build import ensure_binaries

COMPONENTS = ("operator", "gateway")


def kubectl(kubeconfig: Path, *args: str) -> str:
    proc = subprocess.run(
        [str(ensure_binaries() / "kubectl"), f"--kubeconfig={kubeconfig}", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return proc.stdout


def _ts(value: str) -> float:
    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()


def one_restart(kubeconfig: Path, namespace: str, release: str, component: str) -> dict[str, float]:
    deployment = f"{release}-posttrain-operator-{component}"
    selector = f"app.kubernetes.io/component={component},app.kubernetes.io/instance={release}"
    before = {
        p["metadata"]["uid"]
        for p in json.loads(
            kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l", selector, "-o", "json")
        )["items"]
    }
    started = time.monotonic()
    kubectl(kubeconfig, "-n", namespace, "rollout", "restart", f"deployment/{deployment}")
    while True:
        pods: list[dict[str, Any]] = json.loads(
            kubectl(kubeconfig, "-n", namespace, "get", "pods", "-l", selector, "-o", "json")
        )["items"]
        for pod in pods:
            if pod["metadata"]["uid"] in before:
                continue
            conditions = {c["type"]: c for c in pod["status"].get("conditions", [])}
            if conditions.get("Ready", {}).get("status") == "True":
                total = time.monotonic() - started
                created = _ts(pod["metadata"]["creationTimestamp"])
                running = _ts(pod["status"]["containerStatuses"][0]["state"]["running"]["startedAt"])
                ready = _ts(conditions["Ready"]["lastTransitionTime"])
                kubectl(kubeconfig, "-n", namespace, "rollout", "status", f"deployment/{deployment}")
                return {
                    "total": total,
                    "create_to_running": running - created,
                    "running_to_ready": ready - running,
                }
        time.sleep(0.2)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", default="posttrain-e2e")
    parser.add_argument("--release", default="pt")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    print(
        f"{'component':10} {'rounds':>6} {'restart->Ready p50':>19} {'max':>7} "
        f"{'create->running':>16} {'running->Ready':>15}"
    )
    for component in COMPONENTS:
        samples = [
            one_restart(args.kubeconfig, args.namespace, args.release, component) for _ in range(args.rounds)
        ]
        totals = [s["total"] for s in samples]
        print(
            f"{component:10} {len(samples):>6} {statistics.median(totals):>18.1f}s {max(totals):>6.1f}s "
            f"{statistics.median(s['create_to_running'] for s in samples):>15.0f}s "
            f"{statistics.median(s['running_to_ready'] for s in samples):>14.0f}s"
        )


if __name__ == "__main__":
    main()
