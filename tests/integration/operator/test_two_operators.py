"""Two operators against one API server never act on the same object: one holds the Lease and acts,
the other stands by (not ready, watching nothing) and takes over once the first is SIGKILLed; every
job is submitted once and the ledger matches the jobs."""

from __future__ import annotations

import json
import urllib.request
from contextlib import ExitStack
from pathlib import Path

from posttrain_operator.backends.hf_client import KEY_LABEL

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl, wait_for
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    running_operator,
    wait_phase,
)

LEADER = "became the leader"


def _role(op: OperatorProcess) -> str:
    """Both are ready (a standby's broker only reads); the body says which one leads."""
    with urllib.request.urlopen(f"{op.broker_url}/healthz", timeout=10) as reply:
        assert reply.status == 200
        return str(json.loads(reply.read())["role"])


def _alive(op: OperatorProcess) -> bool:
    with urllib.request.urlopen(f"{op.broker_url}/livez", timeout=10) as reply:
        return json.loads(reply.read())["status"] == "alive"


def test_one_operator_acts_and_the_standby_takes_over_when_it_is_killed(
    cluster: devcluster.ClusterState,
    crds: None,
    kubectl: Kubectl,
    namespace: str,
    emulator: HfEmulator,
    tmp_path: Path,
) -> None:
    election = {
        "POSTTRAIN_LEADER_ELECTION_NAMESPACE": namespace,
        "POSTTRAIN_LEADER_ELECTION_NAME": "posttrain-operator",
        "POSTTRAIN_LEASE_DURATION_SECONDS": "6",
        "POSTTRAIN_LEASE_RENEW_SECONDS": "2",
    }
    with ExitStack() as stack:
        ops = []
        for name in ("a", "b"):
            (tmp_path / name).mkdir()
            env = election | {"POSTTRAIN_LEADER_ELECTION_IDENTITY": f"operator-{name}"}
            ops.append(
                stack.enter_context(running_operator(cluster, emulator, tmp_path / name, namespace, **env))
            )
        leader = wait_for(lambda: next((op for op in ops if LEADER in op.current_log()), None),
                          timeout=180, what="one operator to take the Lease")  # fmt: skip
        standby = next(op for op in ops if op is not leader)
        wait_for(lambda: "standing by" in standby.current_log(), timeout=120, what="the other to stand by")
        assert _role(leader) == "leader" and _role(standby) == "standby" and _alive(standby)
        lease = json.loads(
            kubectl("-n", namespace, "get", "lease", "posttrain-operator", "-o", "json").stdout
        )
        assert lease["spec"]["holderIdentity"] in ("operator-a", "operator-b")

        apply(kubectl, namespace, episode_manifest("ep1"))
        wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
        apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
        wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded"}, timeout=90)
        # The standby has not acted on anything: kopf has not even started watching there.
        assert "Handler 'agentjob_reconcile'" not in standby.current_log()
        assert LEADER not in standby.current_log()

        leader.kill()
        wait_for(lambda: LEADER in standby.current_log(), timeout=120, what="the standby to take over")
        assert _role(standby) == "leader"
        apply(kubectl, namespace, agentjob_manifest("job2", "ep1"))
        wait_phase(kubectl, namespace, "agentjob", "job2", {"Succeeded"}, timeout=90)

        # Each job was submitted exactly once, and the ledger is the sum of what the jobs settled.
        assert sorted(emulator.creations_by_label(KEY_LABEL).values()) == [1, 1]
        jobs = [get(kubectl, namespace, "agentjob", n)["status"] for n in ("job1", "job2")]
        ledger = get(kubectl, namespace, "episode", "ep1")["status"]["ledger"]
        assert ledger["reservedMicroUSD"] == 0
        assert ledger["settledMicroUSD"] == sum(j["settledMicroUSD"] for j in jobs) > 0
        assert set(ledger["entries"]) == {"job1", "job2"}
