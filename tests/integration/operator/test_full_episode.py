"""A whole t0_artifact episode through kubectl alone: jobs really run under the launcher in the
emulator, the grader scores the submission on the hidden split, and the reward lands in status."""

from __future__ import annotations

import json

from devstack.hf_emulator import HfEmulator
from tests.conftest import Kubectl
from tests.integration.conftest import (
    REPO,
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    wait_phase,
)

# The example solution the scripted agent submits.
ARTIFACT_SCRIPT = (REPO / "examples" / "t0_artifact_solution.py").read_text()
WRONG_SCRIPT = """
import json, os
with open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "answer.json"), "w") as f:
    json.dump({"k00": 0}, f)
"""


def _run_job(kubectl: Kubectl, namespace: str, name: str, episode: str, script: str) -> dict:
    apply(kubectl, namespace, agentjob_manifest(name, episode, script=script, timeoutSeconds=300))
    return wait_phase(kubectl, namespace, "agentjob", name, {"Succeeded", "Failed", "Rejected"}, timeout=120)


def _submit(kubectl: Kubectl, namespace: str, job: str) -> dict:
    """Set the submission, as the gateway's `submit` does, and wait for the episode's end."""
    patch = json.dumps({"spec": {"submission": {"checkpointFrom": job}}})
    kubectl("-n", namespace, "patch", "episode", "ep1", "--type=merge", "-p", patch)
    return wait_phase(kubectl, namespace, "episode", "ep1", {"Completed", "Failed"}, timeout=180)


def test_t0_artifact_episode_scores_one_when_right(
    kubectl: Kubectl, namespace: str, executing_operator: OperatorProcess, executing_emulator: HfEmulator
) -> None:
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.05"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    job = _run_job(kubectl, namespace, "answer", "ep1", ARTIFACT_SCRIPT)
    assert job["status"]["phase"] == "Succeeded", json.dumps(job["status"])[:2000]
    assert [a["path"] for a in job["status"]["artifacts"]] == ["answer.json"]

    check = agentjob_manifest("check", "ep1", purpose="devEval", script="", checkpointFrom="answer")
    apply(kubectl, namespace, check)
    dev = wait_phase(
        kubectl, namespace, "agentjob", "check", {"Succeeded", "Failed", "Rejected"}, timeout=120
    )
    assert dev["status"]["result"]["status"] == "ok" and dev["status"]["result"]["score"] == "1"

    episode = _submit(kubectl, namespace, "answer")
    status = episode["status"]
    assert status["outcome"] == "Scored" and status["reward"] == "1", json.dumps(status)[:2000]
    ledger = status["ledger"]
    assert ledger["reservedMicroUSD"] == 0
    # The agent paid for its train and devEval jobs; the hidden-split grading is platform spend.
    billed = {r.job_id: r.cost_micro_usd for r in executing_emulator.billing()}
    score_job = get(kubectl, namespace, "agentjob", status["scoringJob"])
    agent_jobs = [job["status"]["backendJobId"], dev["status"]["backendJobId"]]
    assert ledger["settledMicroUSD"] == sum(billed[j] for j in agent_jobs)
    assert ledger["platformMicroUSD"] == billed[score_job["status"]["backendJobId"]]


def test_t0_artifact_episode_scores_zero_when_wrong(
    kubectl: Kubectl, namespace: str, executing_operator: OperatorProcess
) -> None:
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.05"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    job = _run_job(kubectl, namespace, "wrong", "ep1", WRONG_SCRIPT)
    assert job["status"]["phase"] == "Succeeded"
    episode = _submit(kubectl, namespace, "wrong")
    assert episode["status"]["outcome"] == "Scored"
    assert episode["status"]["reward"] == "0"


FORK_BOMB = "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"


def test_a_fork_bomb_fails_its_own_job_while_the_episode_goes_on_to_score(
    kubectl: Kubectl, namespace: str, executing_operator: OperatorProcess, executing_emulator: HfEmulator
) -> None:
    """The agent's other job and the operator carry on: the bomb ends its own job, with the reason."""
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.05"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(
        kubectl,
        namespace,
        agentjob_manifest("bomb", "ep1", script=FORK_BOMB, timeoutSeconds=300),
        agentjob_manifest("answer", "ep1", script=ARTIFACT_SCRIPT, timeoutSeconds=300),
    )
    terminal = {"Succeeded", "Failed", "Rejected"}
    bomb = wait_phase(kubectl, namespace, "agentjob", "bomb", terminal, timeout=180)
    answer = wait_phase(kubectl, namespace, "agentjob", "answer", terminal, timeout=180)
    assert bomb["status"]["phase"] == "Failed"
    assert "reached its limit of 512 processes and threads" in bomb["status"]["message"]
    assert executing_emulator.job_pids(bomb["status"]["backendJobId"]) == set()
    assert answer["status"]["phase"] == "Succeeded", json.dumps(answer["status"])[:2000]
    episode = _submit(kubectl, namespace, "answer")
    assert (episode["status"]["outcome"], episode["status"]["reward"]) == ("Scored", "1")
