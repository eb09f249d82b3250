"""Episode and AgentJob lifecycles end to end: the real API server, the operator process, the emulator."""

from __future__ import annotations

import base64

import yaml
from posttrain_operator.api.rules import token_hash

from devstack.hf_emulator import HfEmulator
from tests.helpers import Kubectl, kubectl_json, wait_for
from tests.integration.support import (
    REPO,
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    wait_phase,
)

CPU_BASIC_MICRO_PER_MINUTE = 167


def test_example_episode_runs_and_shows_spend_columns(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    kubectl("-n", namespace, "apply", "-f", str(REPO / "examples" / "episode-hf-jobs.yaml"))
    name = yaml.safe_load((REPO / "examples" / "episode-hf-jobs.yaml").read_text())["metadata"]["name"]
    episode = wait_phase(kubectl, namespace, "episode", name, {"Running"})

    ledger = episode["status"]["ledger"]
    assert ledger["budgetMicroUSD"] == 50_000
    assert ledger["reservedMicroUSD"] == 0 and ledger["settledMicroUSD"] == 0
    # No token hash in the spec: the operator made a token and keeps it in a Secret the Episode owns.
    secret = kubectl_json(kubectl, "-n", namespace, "get", "secret", episode["status"]["agentTokenSecret"])
    assert secret["metadata"]["ownerReferences"][0]["uid"] == episode["metadata"]["uid"]
    token = base64.b64decode(secret["data"]["token"]).decode()
    assert token_hash(token) == episode["status"]["agentTokenHash"]

    table = kubectl("-n", namespace, "get", "eps,aj").stdout
    header = table.splitlines()[0].split()
    assert header == ["NAME", "PHASE", "TASK", "SPENT", "RESERVED", "BUDGET", "REWARD", "AGE"]
    assert "Running" in table and "t0_artifact" in table and "0.05" in table


def test_job_is_admitted_run_and_settled_at_billed_minutes(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.50"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1", timeoutSeconds=600))

    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded"})
    status = job["status"]
    assert status["backendJobId"] in emulator.job_ids()
    assert status["idempotencyKey"] == f"aj-{job['metadata']['uid']}"
    assert status["billedSeconds"] >= 1
    billed = next(r for r in emulator.billing() if r.job_id == status["backendJobId"])
    assert status["settledMicroUSD"] == billed.cost_micro_usd == CPU_BASIC_MICRO_PER_MINUTE
    assert job["metadata"]["ownerReferences"][0]["kind"] == "Episode"

    episode = wait_for(
        lambda: (e := get(kubectl, namespace, "episode", "ep1"))["status"]["ledger"]["settledMicroUSD"] and e,
        what="the episode ledger to settle",
    )
    ledger = episode["status"]["ledger"]
    assert ledger["reservedMicroUSD"] == 0
    assert ledger["settledMicroUSD"] == CPU_BASIC_MICRO_PER_MINUTE
    assert ledger["spentUSD"] == "0.000167"

    # The job's story is told in Events, and kopf's log keeps its per-job lines but none per watch event.
    wait_for(
        lambda: {"Admitted", "Submitted"} <= {
            e["reason"] for e in kubectl_json(kubectl, "-n", namespace, "get", "events",
                                              "--field-selector=involvedObject.name=job1")["items"]
        },
        what="the job's Admitted and Submitted events",
    )  # fmt: skip
    logs = operator.logs()
    assert "Handler 'agentjob_reconcile' succeeded." in logs
    assert "Handler 'agentjob_observe' succeeded." not in logs


def test_job_over_budget_is_rejected_with_the_numbers(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    # 600 s on cpu-basic reserves 10 minutes x $0.000167 = $0.00167; the budget is $0.001.
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.001"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("big", "ep1", timeoutSeconds=600))

    job = wait_phase(kubectl, namespace, "agentjob", "big", {"Rejected"})
    assert job["status"]["reason"] == "BudgetExceeded"
    assert "$0.00167" in job["status"]["message"] and "$0.001" in job["status"]["message"]
    ledger = get(kubectl, namespace, "episode", "ep1")["status"]["ledger"]
    assert ledger["reservedMicroUSD"] == 0 and "big" not in ledger.get("entries", {})


def test_job_naming_a_missing_episode_is_rejected(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    apply(kubectl, namespace, agentjob_manifest("lost", "no-such-episode"))
    job = wait_phase(kubectl, namespace, "agentjob", "lost", {"Rejected"})
    assert job["status"]["reason"] == "EpisodeNotFound"
    assert "no-such-episode" in job["status"]["message"]


def test_score_job_from_a_user_is_rejected(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    apply(kubectl, namespace, episode_manifest("ep1"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(
        kubectl,
        namespace,
        agentjob_manifest("fake-score", "ep1", purpose="score", script="", checkpointFrom="x"),
    )
    job = wait_phase(kubectl, namespace, "agentjob", "fake-score", {"Rejected"})
    assert job["status"]["message"] == "score jobs are created only by the operator"


def test_inputs_a_kubectl_user_names_wrongly_are_rejected_with_the_reason(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess
) -> None:
    """What only the operator can know: whether each named job exists in the same episode, is a train
    job and has Succeeded. A job that names such inputs is Rejected before any reservation."""
    apply(kubectl, namespace, episode_manifest("ep1"), episode_manifest("ep2"))
    for episode in ("ep1", "ep2"):
        wait_phase(kubectl, namespace, "episode", episode, {"Running"})
    apply(kubectl, namespace, agentjob_manifest("done", "ep1"), agentjob_manifest("theirs", "ep2"))
    for job in ("done", "theirs"):
        wait_phase(kubectl, namespace, "agentjob", job, {"Succeeded"})
    dev = agentjob_manifest("dev", "ep1", purpose="devEval", script="", checkpointFrom="done")
    apply(kubectl, namespace, dev)
    wait_phase(kubectl, namespace, "agentjob", "dev", {"Succeeded", "Failed"})
    cases = {
        "from-missing": (["no-such-job"], "no job 'no-such-job' in episode 'ep1'"),
        "from-theirs": (["theirs"], "no job 'theirs' in episode 'ep1'"),
        "from-dev": (["dev"], "'dev' is a devEval job, not a train job"),
        "from-both": (["done", "dev"], "'dev' is a devEval job"),
    }
    for name, (inputs, _) in cases.items():
        apply(kubectl, namespace, agentjob_manifest(name, "ep1", inputsFrom=inputs))
    for name, (_, message) in cases.items():
        decided = {"Rejected", "Admitted", "Running"}
        status = wait_phase(kubectl, namespace, "agentjob", name, decided)["status"]
        assert (status["phase"], status["reason"]) == ("Rejected", "InvalidJob"), status
        assert message in status["message"]
    entries = get(kubectl, namespace, "episode", "ep1")["status"]["ledger"]["entries"]
    assert not set(cases) & set(entries)  # refused before any reservation
    apply(kubectl, namespace, agentjob_manifest("from-done", "ep1", inputsFrom=["done"]))
    admitted = wait_phase(kubectl, namespace, "agentjob", "from-done", {"Succeeded", "Rejected"})
    assert admitted["status"]["phase"] == "Succeeded" and admitted["status"]["lineage"] == ["done"]
