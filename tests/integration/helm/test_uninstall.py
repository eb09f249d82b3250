"""The chart's pre-delete safeguard, with the chart's own hook objects and command: while the operator
still runs, it deletes the release's Episodes and waits until they are gone, so the backend job an
Episode was running is confirmed cancelled before the operator goes. (The devstack has no node: the
hook Job's one container runs here as a process, with the hook ServiceAccount's credentials.)"""

from __future__ import annotations

from pathlib import Path

import yaml

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl, make_kubectl, wait_for
from tests.integration.helm.support import ChartOperator, Release, helm
from tests.integration.support import agentjob_manifest, apply, episode_manifest, wait_phase

SLEEPER = "import time\ntime.sleep(600)\n"


def test_uninstall_deletes_episodes_and_cancels_their_jobs_before_the_operator_goes(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    release: Release,
    chart_operator: ChartOperator,
    executing_emulator: HfEmulator,
    tmp_path: Path,
) -> None:
    ns = release.namespace
    apply(kubectl, ns, episode_manifest("ep1", budget="0.50"))
    wait_phase(kubectl, ns, "episode", "ep1", {"Running"})
    apply(kubectl, ns, agentjob_manifest("job1", "ep1", script=SLEEPER))
    backend_id = wait_phase(kubectl, ns, "agentjob", "job1", {"Running"})["status"]["backendJobId"]
    executing_emulator.wait_for_stage(backend_id, ("RUNNING",), timeout=60)

    hooks = [d for d in yaml.safe_load_all(helm(cluster, "get", "hooks", release.name, "-n", ns).stdout) if d]
    pre_delete = [d for d in hooks if d["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"]
    job = next(d for d in pre_delete if d["kind"] == "Job")
    # Everything but the Job, as helm creates it first (lower hook weight).
    kubectl("apply", "-f", "-", input=yaml.safe_dump_all([d for d in pre_delete if d["kind"] != "Job"]))
    sa = job["spec"]["template"]["spec"]["serviceAccountName"]
    as_hook = make_kubectl(
        cluster, devcluster.mint_service_account_kubeconfig(cluster, ns, sa, tmp_path / "hook.kc")
    )
    (container,) = job["spec"]["template"]["spec"]["containers"]  # one per watched namespace
    assert container["command"] == ["kubectl"]
    assert f"--namespace={ns}" in container["args"]

    done = as_hook(*container["args"])
    assert 'episode.posttrain.dev "ep1" deleted' in done.stdout, done.stdout
    # The Episode is gone only once its finalizer saw every job confirmed cancelled on the backend.
    assert executing_emulator.job(backend_id)["status"]["stage"] == "CANCELED"
    # Its AgentJob follows (garbage collection of the owned object; already Cancelled, nothing to do).
    wait_for(lambda: kubectl("-n", ns, "get", "episodes,agentjobs", "-o", "name").stdout.split() == [],
             what="the Episode's AgentJob to be collected")  # fmt: skip
    # The hook's identity may do nothing else.
    assert as_hook("-n", ns, "get", "secrets", check=False).returncode != 0
    assert as_hook("-n", ns, "delete", "agentjobs", "--all", check=False).returncode != 0
