"""The floor kopf sets under admission: a kopf operator that does nothing but admit.

    python bench/kopf_floor.py [--devstack NAME] [--jobs 40]

This file is also the operator (`kopf run bench/kopf_floor.py`): an AgentJob create handler that
writes `status.phase: Admitted` in one merge patch, and a delete handler, so that kopf adds its
finalizer first, as it does for the real operator. The bench runs it against the devstack control
plane and times, in the same run, a raw API create+get (ConfigMap) and AgentJob create -> `Admitted`
seen on a watch, one job at a time, 0.2 s apart (as `operator_scale.py` times admission). The real
operator's admission does all of this plus the Episode's ledger write before its status write.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import statistics
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import kopf
from kubernetes_asyncio import client, config, watch

GROUP, VERSION = "posttrain.dev", "v1alpha1"
REPO = Path(__file__).resolve().parents[1]


@kopf.on.create(GROUP, VERSION, "agentjobs")
async def admit(name: str, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    await memo.custom.patch_namespaced_custom_object_status(
        GROUP, VERSION, namespace, "agentjobs", name, {"status": {"phase": "Admitted"}},
        _content_type="application/merge-patch+json",
    )  # fmt: skip


@kopf.on.delete(GROUP, VERSION, "agentjobs")
async def release(**_: Any) -> None:
    """Nothing to release: present so that kopf adds its finalizer before `admit` runs."""


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    settings.posting.level = logging.WARNING  # no Event per handler run, as in the real operator
    await config.load_kube_config()
    memo.custom = client.CustomObjectsApi(client.ApiClient())


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def measure(namespace: str, jobs: int) -> tuple[list[float], list[float]]:
    """(raw create+get, create -> Admitted) seconds, interleaved one at a time."""
    api = client.ApiClient()
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    created: dict[str, float] = {}
    admitted: dict[str, float] = {}
    seen: dict[str, asyncio.Event] = {}

    async def watch_jobs() -> None:
        async with watch.Watch().stream(
            custom.list_namespaced_custom_object, GROUP, VERSION, namespace, "agentjobs", timeout_seconds=600
        ) as stream:  # fmt: skip
            async for event in stream:
                obj = event["object"]
                name = obj["metadata"]["name"]
                if obj.get("status", {}).get("phase") == "Admitted" and name not in admitted:
                    admitted[name] = time.perf_counter()
                    seen.setdefault(name, asyncio.Event()).set()

    async def seen_admitted(name: str) -> None:
        await seen.setdefault(name, asyncio.Event()).wait()

    def job(name: str) -> dict[str, Any]:
        return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentJob", "metadata": {"name": name},
                "spec": {"episode": "e", "purpose": "train", "script": "print(1)", "flavor": "cpu-basic",
                         "timeoutSeconds": 60}}  # fmt: skip

    watcher = asyncio.create_task(watch_jobs())
    raw = []
    try:
        # The watch is up and kopf is handling events once a first job is seen admitted.
        await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", job("warm-up"))
        await asyncio.wait_for(seen_admitted("warm-up"), timeout=120)
        for i in range(jobs):
            started = time.perf_counter()
            await core.create_namespaced_config_map(namespace, {"metadata": {"name": f"probe-{i}"}})
            await core.read_namespaced_config_map(f"probe-{i}", namespace)
            raw.append(time.perf_counter() - started)
            await asyncio.sleep(0.2)
            created[f"j{i}"] = time.perf_counter()
            await custom.create_namespaced_custom_object(GROUP, VERSION, namespace, "agentjobs", job(f"j{i}"))
            await asyncio.sleep(0.2)
        await asyncio.wait_for(asyncio.gather(*(seen_admitted(name) for name in created)), timeout=120)
    finally:
        watcher.cancel()
        await api.close()
    return raw, [admitted[name] - created[name] for name in created]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--devstack", default="default", help="the running devstack cluster to use")
    parser.add_argument("--jobs", type=int, default=40)
    opts = parser.parse_args()
    sys.path[:0] = [str(REPO)]
    from devstack.controlplane import cluster as devcluster

    state = devcluster.load_state(opts.devstack)
    if state is None:
        raise SystemExit(f"devstack cluster {opts.devstack!r} is not running: python -m devstack cluster up")
    kubectl = [str(state.kubectl()), f"--kubeconfig={state.kubeconfig}"]
    subprocess.run([*kubectl, "apply", "--server-side", "--force-conflicts", "-f", str(REPO / "crds")],
                   check=True, capture_output=True)  # fmt: skip
    namespace = f"kopf-floor-{uuid.uuid4().hex[:6]}"
    subprocess.run([*kubectl, "create", "namespace", namespace], check=True, capture_output=True)
    env = {**os.environ, "KUBECONFIG": str(state.kubeconfig)}
    operator = subprocess.Popen(
        [sys.executable, "-m", "kopf", "run", "--standalone", f"--namespace={namespace}", __file__],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        asyncio.run(config.load_kube_config(str(state.kubeconfig)))
        raw, admission = asyncio.run(measure(namespace, opts.jobs))
        # While kopf still runs, so that it takes its finalizers off and the namespace can go.
        subprocess.run([*kubectl, "-n", namespace, "delete", "agentjobs", "--all", "--timeout=120s"],
                       capture_output=True)  # fmt: skip
    finally:
        operator.terminate()
        operator.wait(30)
        subprocess.run([*kubectl, "delete", "namespace", namespace, "--wait=false"], capture_output=True)
    for label, times in (("raw API create+get", raw), ("kopf create -> Admitted", admission)):
        p50, p99 = statistics.median(times) * 1000, percentile(times, 0.99) * 1000
        print(f"{label:24s}  p50 {p50:6.1f} ms   p99 {p99:6.1f} ms")
    print(f"floor / raw               {statistics.median(admission) / statistics.median(raw):6.1f}x (p50)")


if __name__ == "__main__":
    main()
