"""Pod start latency on a cluster with a node: the chart's operator and gateway, and job pods.

    python bench/pod_start.py --kubeconfig KUBECONFIG [--namespace posttrain-e2e] [--rounds 5]
    python bench/pod_start.py --kubeconfig KUBECONFIG --jobs 20   # pods-backend job pods
    python bench/pod_start.py --kubeconfig KUBECONFIG --jobs 20 --flavors cpu-basic,cpu-gvisor
    python bench/pod_start.py --kubeconfig KUBECONFIG --train 2 --flavors cpu-basic,cpu-gvisor

Job pods (`--jobs N`, the chart installed with `pods.enabled`): one Episode with `backend: pods`
and N train AgentJobs per flavor created one after another (the flavors taking turns), each a script
that prints the time it starts; the first flavor is the baseline of the ratio (runc against gVisor:
two flavors that differ in `runtimeClassName` only). `--train N`: the arithmetic task's CPU
fine-tune, N per flavor, timed per optimizer step.
Per job: AgentJob created (here) -> pod created (its creationTimestamp, whole seconds) -> script
start (the script's own clock: the node shares this machine's), and the launcher's egress check
(the seconds it reports in its log, between container start and the script).

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
import math
import re
import statistics
import subprocess
import time
import uuid
from datetime import datetime
from pathlib import Path
from typing import Any

from devstack.toolchain.build import ensure_binaries

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


JOB_SCRIPT = "import time\nprint('script-start', repr(time.time()), flush=True)\n"
EGRESS_LINE = re.compile(r"egress verified: (\d+) probes closed \((\d+) round\(s\), ([\d.]+)s\)")


def _apply(kubeconfig: Path, namespace: str, body: dict[str, Any]) -> None:
    subprocess.run(
        [
            str(ensure_binaries() / "kubectl"),
            f"--kubeconfig={kubeconfig}",
            "-n",
            namespace,
            "create",
            "-f",
            "-",
        ],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        check=True,
    )


def _wait(
    kubeconfig: Path, namespace: str, kind: str, name: str, done: Any, timeout: float = 600
) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        obj: dict[str, Any] = json.loads(
            kubectl(kubeconfig, "-n", namespace, "get", kind, name, "-o", "json")
        )
        if done(obj.get("status") or {}):
            return obj
        time.sleep(0.2)
    raise TimeoutError(f"{kind} {name} did not finish in {timeout}s")


def _episode(kubeconfig: Path, namespace: str, task: str, flavors: list[str], jobs: int) -> str:
    episode = f"bench-pods-{uuid.uuid4().hex[:6]}"
    _apply(kubeconfig, namespace, {
        "apiVersion": "posttrain.dev/v1alpha1", "kind": "Episode", "metadata": {"name": episode},
        "spec": {"task": task, "budgetUSD": "5.00", "backend": "pods", "agentTokenHash": "0" * 64,
                 "flavors": flavors, "limits": {"maxSteps": jobs + 5, "maxWallSeconds": 7200}},
    })  # fmt: skip
    _wait(kubeconfig, namespace, "episode", episode, lambda s: s.get("phase") == "Running")
    return episode


def _run_job(
    kubeconfig: Path, namespace: str, episode: str, name: str, script: str, flavor: str, timeout: int
) -> tuple[float, dict[str, Any], dict[str, Any], str]:
    """One train job, created and waited for: (created at, its AgentJob, its pod, its log)."""
    created = time.time()
    _apply(kubeconfig, namespace, {
        "apiVersion": "posttrain.dev/v1alpha1", "kind": "AgentJob", "metadata": {"name": name},
        "spec": {"episode": episode, "purpose": "train", "script": script, "flavor": flavor,
                 "timeoutSeconds": timeout},
    })  # fmt: skip
    job = _wait(
        kubeconfig, namespace, "agentjob", name, lambda s: s.get("phase") in ("Succeeded", "Failed"), timeout
    )
    if job["status"]["phase"] != "Succeeded":
        raise RuntimeError(f"{name} ({flavor}) failed: {job['status'].get('message')}")
    pod_ns, pod_name = job["status"]["backendJobId"].split("/")
    pod = json.loads(kubectl(kubeconfig, "-n", pod_ns, "get", "pod", pod_name, "-o", "json"))
    return created, job, pod, kubectl(kubeconfig, "-n", pod_ns, "logs", pod_name)


def job_pods(kubeconfig: Path, namespace: str, count: int, flavors: list[str]) -> list[dict[str, Any]]:
    """`count` jobs per flavor, the flavors taking turns, so each sees the same machine."""
    episode = _episode(kubeconfig, namespace, "t0_artifact", flavors, count * len(flavors))
    samples: list[dict[str, Any]] = []
    try:
        for i in range(count * len(flavors)):
            flavor = flavors[i % len(flavors)]
            created, job, pod, logs = _run_job(
                kubeconfig, namespace, episode, f"{episode}-{i}", JOB_SCRIPT, flavor, 120
            )
            start = float(re.search(r"script-start ([\d.e+]+)", logs).group(1))  # type: ignore[union-attr]
            egress = EGRESS_LINE.search(logs)
            samples.append({
                "flavor": flavor,
                "runtime": (job["status"].get("runtime") or {}).get("runtimeClass") or "default",
                "job_to_script": start - created,
                "pod_to_script": start - _ts(pod["metadata"]["creationTimestamp"]),
                "egress": float(egress.group(3)) if egress else math.nan,
                "egress_rounds": float(egress.group(2)) if egress else math.nan,
            })  # fmt: skip
    finally:
        kubectl(kubeconfig, "-n", namespace, "delete", "episode", episode, "--wait=false")
    return samples


TRAIN_SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "train_arithmetic_sft.py"
STEP_LINE = re.compile(r"^step (\d+) .*\((\d+)s\)$", re.M)


def train_steps(kubeconfig: Path, namespace: str, rounds: int, flavors: list[str]) -> list[dict[str, Any]]:
    """The t0_arithmetic_format fine-tune (examples/train_arithmetic_sft.py), `rounds` per flavor in
    turns: seconds per optimizer step from its own log (its last progress line: steps, elapsed)."""
    episode = _episode(kubeconfig, namespace, "t0_arithmetic_format", flavors, rounds * len(flavors))
    samples: list[dict[str, Any]] = []
    try:
        for i in range(rounds * len(flavors)):
            flavor = flavors[i % len(flavors)]
            _, job, _, logs = _run_job(
                kubeconfig, namespace, episode, f"{episode}-{i}", TRAIN_SCRIPT.read_text(), flavor, 1800
            )
            steps, elapsed = (int(g) for g in STEP_LINE.findall(logs)[-1])
            samples.append({
                "flavor": flavor,
                "runtime": (job["status"].get("runtime") or {}).get("runtimeClass") or "default",
                "step_seconds": elapsed / steps,
                "steps": steps,
            })  # fmt: skip
    finally:
        kubectl(kubeconfig, "-n", namespace, "delete", "episode", episode, "--wait=false")
    return samples


def _by_flavor(samples: list[dict[str, Any]], key: str, label: str, flavors: list[str]) -> None:
    """One line per flavor, and each flavor's p50 over the first one's (the baseline) in this run."""
    baseline = statistics.median(s[key] for s in samples if s["flavor"] == flavors[0])
    for flavor in flavors:
        values = [s[key] for s in samples if s["flavor"] == flavor]
        runtime = next(s["runtime"] for s in samples if s["flavor"] == flavor)
        p50 = statistics.median(values)
        print(f"{label:28} {flavor:12} {runtime:8} {len(values):>3} {p50:>6.2f}s "
              f"{percentile(values, 0.99):>6.2f}s {max(values):>6.2f}s {p50 / baseline:>6.2f}x")  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--namespace", default="posttrain-e2e")
    parser.add_argument("--release", default="pt")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=0, help="measure N pods-backend job pods (per flavor)")
    parser.add_argument("--train", type=int, default=0, help="measure N arithmetic fine-tunes (per flavor)")
    parser.add_argument(
        "--flavors",
        default="cpu-basic",
        help="comma-separated; the first is the baseline (e.g. cpu-basic,cpu-gvisor)",
    )
    args = parser.parse_args()
    flavors = args.flavors.split(",")
    header = f"{'':28} {'flavor':12} {'runtime':8} {'n':>3} {'p50':>7} {'p99':>7} {'max':>7} {'p50/base':>7}"
    if args.train:
        print(header)
        _by_flavor(train_steps(args.kubeconfig, args.namespace, args.train, flavors), "step_seconds",
                   "arithmetic SFT, s per step", flavors)  # fmt: skip
        return
    if args.jobs:
        samples = job_pods(args.kubeconfig, args.namespace, args.jobs, flavors)
        print(header)
        for key, label in (
            ("job_to_script", "AgentJob created -> script"),
            ("pod_to_script", "pod created -> script"),
            ("egress", "egress check (launcher)"),
        ):
            _by_flavor(samples, key, label, flavors)
        retried = sum(1 for s in samples if s["egress_rounds"] > 1)
        print(f"egress checks that found something open in their first round (policy not yet in place): "
              f"{retried}/{len(samples)}")  # fmt: skip
        return
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
