"""A whole t0_artifact episode through kubectl alone: jobs really run under the launcher in the
emulator, the grader scores the submission on the hidden split, and the reward lands in status."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from tests.checkpoint_jobs import BIG_CHECKPOINT, OPTIMIZER_STATE, RESUMED
from tests.helpers import Kubectl
from tests.integration.hostile_jobs import FORK_BOMB, MEMORY_BOMB, NESTED_ANSWER
from tests.integration.support import (
    REPO,
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    running_operator,
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
    paths = [a["path"] for a in job["status"]["artifacts"]]
    assert paths == ["answer.json", "posttrain-job.log", "posttrain-script.py"]

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


@pytest.mark.parametrize(
    ("script", "grader_status"),
    [(WRONG_SCRIPT, "ok"), (NESTED_ANSWER, "invalid_checkpoint")],
    ids=["wrong-answer", "answer-of-200k-nested-arrays"],
)
def test_t0_artifact_episode_scores_zero_never_null_when_wrong_or_hostile(
    kubectl: Kubectl, namespace: str, executing_operator: OperatorProcess, script: str, grader_status: str
) -> None:
    """A hostile answer is the agent's failure, not the platform's: reward "0", outcome Scored."""
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.05"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    job = _run_job(kubectl, namespace, "wrong", "ep1", script)
    assert job["status"]["phase"] == "Succeeded"
    episode = _submit(kubectl, namespace, "wrong")
    assert (episode["status"]["outcome"], episode["status"]["reward"]) == ("Scored", "0"), episode["status"]
    score_job = get(kubectl, namespace, "agentjob", episode["status"]["scoringJob"])
    assert score_job["status"]["result"]["status"] == grader_status


SMALL_MACHINE = {"max_job_memory_bytes": 512 << 20}


@pytest.mark.parametrize("executing_emulator", [SMALL_MACHINE], indirect=True, ids=["512MiB-per-job"])
def test_a_fork_bomb_and_a_memory_bomb_fail_their_own_jobs_while_the_episode_goes_on_to_score(
    kubectl: Kubectl, namespace: str, executing_operator: OperatorProcess, executing_emulator: HfEmulator
) -> None:
    """The agent's other job and the operator carry on: each bomb ends its own job, with the reason."""
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.05", limits={"maxConcurrentJobs": 3}))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(
        kubectl,
        namespace,
        agentjob_manifest("fork-bomb", "ep1", script=FORK_BOMB, timeoutSeconds=300),
        agentjob_manifest("memory-bomb", "ep1", script=MEMORY_BOMB, timeoutSeconds=300),
        agentjob_manifest("answer", "ep1", script=ARTIFACT_SCRIPT, timeoutSeconds=300),
    )
    terminal = {"Succeeded", "Failed", "Rejected"}
    fork_bomb = wait_phase(kubectl, namespace, "agentjob", "fork-bomb", terminal, timeout=180)
    memory_bomb = wait_phase(kubectl, namespace, "agentjob", "memory-bomb", terminal, timeout=180)
    answer = wait_phase(kubectl, namespace, "agentjob", "answer", terminal, timeout=180)
    assert fork_bomb["status"]["phase"] == "Failed"
    assert "reached its limit of 512 processes and threads" in fork_bomb["status"]["message"]
    assert memory_bomb["status"]["phase"] == "Failed"
    assert f"out of memory: the job used all of its {512 << 20} bytes" in memory_bomb["status"]["message"]
    for bomb in (fork_bomb, memory_bomb):
        assert executing_emulator.job_pids(bomb["status"]["backendJobId"]) == set()
    assert answer["status"]["phase"] == "Succeeded", json.dumps(answer["status"])[:2000]
    episode = _submit(kubectl, namespace, "answer")
    assert (episode["status"]["outcome"], episode["status"]["reward"]) == ("Scored", "1")
    assert executing_operator.proc is not None and executing_operator.proc.poll() is None


# Sparse files: the caps count apparent sizes, so these pass 2 GiB without writing it to disk.
FILE_PAST_CAP = """
import os
with open(os.path.join(os.environ["TMPDIR"], "shard.safetensors"), "wb") as f:
    f.seek((2 << 30) - 1)
    f.write(b"xx")  # the second byte would pass the t0 task's max_file_bytes (2 GiB)
"""
OUTPUTS_PAST_CAP = """
import os, time
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
for i in range(2):
    with open(os.path.join(out, f"shard-{i}.safetensors"), "wb") as f:
        f.seek(1536 << 20)
        f.write(b"x")
time.sleep(300)  # the launcher's scan stops it
"""

SCRATCH_PAST_CAP = """
import os, time
for i in range(6):  # 12 GiB of scratch past the t0 task's 10 GiB, each file under its 2 GiB file cap
    with open(os.path.join(os.environ["TMPDIR"], f"cache-{i}.bin"), "wb") as f:
        f.seek((2 << 30) - 2)
        f.write(b"x")
time.sleep(300)  # the launcher's scan stops it
"""


@pytest.mark.parametrize(
    ("script", "reason", "artifacts"),
    [
        (FILE_PAST_CAP, "FileSizeCapExceeded", ["posttrain-job.log", "posttrain-script.py"]),
        (OUTPUTS_PAST_CAP, "OutputCapExceeded", []),
        (SCRATCH_PAST_CAP, "ScratchCapExceeded", []),
        # The trl task's 5 GiB of checkpoint state (below), written for real under t0's 2 GiB caps:
        # its 3 GiB shard stops at the file cap, by when the outputs are past theirs, which is named.
        (OPTIMIZER_STATE, "OutputCapExceeded", []),
    ],
    ids=["file-cap", "output-cap", "scratch-cap", "the-5-gib-checkpoint-under-t0"],
)
def test_a_job_past_its_tasks_caps_fails_with_the_cap_named_and_a_capped_one_publishes_nothing(
    kubectl: Kubectl,
    namespace: str,
    executing_operator: OperatorProcess,
    script: str,
    reason: str,
    artifacts: list[str],
) -> None:
    apply(kubectl, namespace, episode_manifest("ep1"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    job = _run_job(kubectl, namespace, "capped", "ep1", script)
    status = job["status"]
    assert (status["phase"], status["reason"]) == ("Failed", reason), json.dumps(status)[:2000]
    assert [a["path"] for a in status.get("artifacts", [])] == artifacts


def test_a_5_gib_checkpoint_chains_into_a_second_job_which_is_graded_on_the_tasks_grader_flavor(
    cluster: devcluster.ClusterState,
    crds: None,
    kubectl: Kubectl,
    namespace: str,
    executing_emulator: HfEmulator,
    tmp_path: Path,
) -> None:
    images = json.dumps({"trl": "registry.example/posttrain-env-trl:test"})  # the emulator runs any image
    environments = {"POSTTRAIN_ENVIRONMENT_IMAGES": images}
    with running_operator(cluster, executing_emulator, tmp_path, namespace, **environments):
        apply(kubectl, namespace, episode_manifest("ep1", task="t0_arithmetic_format_trl", budget="0.25"))
        wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
        # Generous bounds: 5 GiB written and read back on a slow, busy disk.
        writer = agentjob_manifest("first", "ep1", script=BIG_CHECKPOINT, timeoutSeconds=1500)
        apply(kubectl, namespace, writer)
        ended = {"Succeeded", "Failed", "Rejected"}
        first = wait_phase(kubectl, namespace, "agentjob", "first", ended, 1500)
        assert first["status"]["phase"] == "Succeeded", json.dumps(first["status"])[:2000]
        sizes = {a["path"]: a["size"] for a in first["status"]["artifacts"]}
        assert sizes["optimizer-state-00001-of-00002.raw"] == 3 << 30 and sum(sizes.values()) > 5 << 30

        apply(kubectl, namespace, agentjob_manifest("second", "ep1", script=RESUMED, timeoutSeconds=900,
                                                    inputsFrom=["first"]))  # fmt: skip
        second = wait_phase(kubectl, namespace, "agentjob", "second", ended, 900)
        assert second["status"]["phase"] == "Succeeded", json.dumps(second["status"])[:2000]
        assert second["status"]["lineage"] == ["first"]

        check = agentjob_manifest("check", "ep1", purpose="devEval", script="", checkpointFrom="second",
                                  flavor="cpu-upgrade")  # fmt: skip
        apply(kubectl, namespace, check)
        dev = wait_phase(kubectl, namespace, "agentjob", "check", ended, 600)
        assert dev["status"]["result"]["status"] == "ok", json.dumps(dev["status"])[:2000]
        episode = _submit(kubectl, namespace, "second")
    status = episode["status"]
    assert status["outcome"] == "Scored" and status["reward"] is not None, json.dumps(status)[:2000]
    score = get(kubectl, namespace, "agentjob", status["scoringJob"])
    assert score["spec"]["flavor"] == "cpu-upgrade"  # the task's grader flavor, not the episode's first
    # Every job settled at its billed minutes: the ledger holds no reservation.
    entries = status["ledger"]["entries"]
    assert {"first", "second", "check", status["scoringJob"]} <= set(entries)
    assert all(e.get("settledMicroUSD") is not None for e in entries.values()), entries
