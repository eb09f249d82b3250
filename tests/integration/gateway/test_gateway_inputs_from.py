"""Jobs that build on jobs, as an agent drives them: a train job reads an earlier job's outputs
(read-only) through inputs_from, writes a changed checkpoint, and that one is dev-evaluated and
submitted; the lineage is in the job's status; every input it may not read is refused at jobs_submit
with its reason, and nothing is created."""

from __future__ import annotations

from tests.helpers import Kubectl
from tests.integration.gateway.agent_steps import finished, result
from tests.integration.gateway.support import GatewayServer, orchestrator, snapshot
from tests.integration.support import REPO, get

# The first job leaves a draft of the answer; the second reads it, finds its input read-only, and
# publishes the answer (the draft's keys, as the solution computes them).
DRAFT = (REPO / "examples" / "t0_artifact_solution.py").read_text().replace("answer.json", "draft.json")
FINISH = """
import json, os, shutil
source = os.environ["POSTTRAIN_INPUT_FROM_0"]
draft = json.load(open(os.path.join(source, "draft.json")))
try:
    open(os.path.join(source, "draft.json"), "w").write("{}")
    raise SystemExit("the input was writable")
except OSError:
    pass
json.dump(draft, open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "answer.json"), "w"))
print("finished", len(draft), "keys from", os.path.basename(source))
"""


async def test_a_train_job_builds_on_an_earlier_ones_outputs_and_is_graded_and_submitted(
    executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    namespace = executing_gateway.namespace
    async with orchestrator(executing_gateway) as orch:
        episode = (await orch.reset(task="t0_artifact", budget_usd="0.05"))["observation"]["episode"]
        first = result(await orch.call("jobs_submit", script=DRAFT, timeout_seconds=120))["job"]["name"]
        assert (await finished(orch, first))["phase"] == "Succeeded"
        second = result(
            await orch.call("jobs_submit", script=FINISH, timeout_seconds=120, inputs_from=[first])
        )["job"]
        assert second["inputs_from"] == [first] and second["lineage"] == [first]
        done = await finished(orch, second["name"])
        logs = result(await orch.call("jobs_logs", job=second["name"]))["lines"]
        assert done["phase"] == "Succeeded", (done, logs)
        assert logs[-1].startswith("finished ") and logs[-1].endswith(f" keys from {first}"), logs
        dev = result(await orch.call("dev_evaluate", job=second["name"], timeout_seconds=120))["job"]
        graded = await finished(orch, dev["name"])
        assert graded["result"]["score"] == "1" and graded["flavor"] == "cpu-basic"
        result(await orch.call("submit", job=second["name"]))
        ended = result(await orch.call("jobs_wait", timeout_seconds=25))
        while not ended["finished"]:
            ended = result(await orch.call("jobs_wait", timeout_seconds=25))
        assert (ended["outcome"], ended["reward"]) == ("Scored", "1")
    assert get(kubectl, namespace, "agentjob", second["name"])["status"]["lineage"] == [first]
    # Each job was settled at its billed minutes: the ledger holds no reservation.
    ledger = get(kubectl, namespace, "episode", episode)["status"]["ledger"]
    assert ledger["reservedMicroUSD"] == 0
    entries = ledger["entries"]
    assert all(entries[name]["settledMicroUSD"] > 0 for name in (first, second["name"], dev["name"]))


async def test_inputs_a_job_may_not_read_are_refused_at_jobs_submit_and_nothing_is_created(
    executing_gateway: GatewayServer, kubectl: Kubectl
) -> None:
    namespace = executing_gateway.namespace
    async with orchestrator(executing_gateway) as orch:
        await orch.reset(task="t0_artifact", budget_usd="0.05")
        theirs = result(await orch.call("jobs_submit", script=DRAFT, timeout_seconds=120))["job"]["name"]
        await orch.reset(task="t0_artifact", budget_usd="0.05")
        failed = result(await orch.call("jobs_submit", script="raise SystemExit(1)", timeout_seconds=120))
        failed_name = failed["job"]["name"]
        assert (await finished(orch, failed_name))["phase"] == "Failed"
        running = result(
            await orch.call("jobs_submit", script="import time\ntime.sleep(540)", timeout_seconds=600)
        )["job"]["name"]
        jobs_before = snapshot(kubectl, namespace)[1]
        refusals = {
            "no such job": (["no-such-job"], "no job 'no-such-job'"),
            "another episode's": ([theirs], f"no job '{theirs}'"),
            "failed": ([failed_name], "is Failed; only a Succeeded job's outputs"),
            "running": ([running], "only a Succeeded job's outputs"),
            "twice": ([failed_name, failed_name], "names a job twice"),
        }
        for what, (inputs, message) in refusals.items():
            step = await orch.call("jobs_submit", script="print(1)", timeout_seconds=60, inputs_from=inputs)
            error = step["observation"]["error"]
            assert error is not None and message in error["message"], (what, step)
            assert step["metadata"]["error_code"] == "invalid_inputs_from", (what, step)
        too_many = await orch.call(
            "jobs_submit", script="print(1)", timeout_seconds=60, inputs_from=[f"j{i}" for i in range(9)]
        )
        assert too_many["observation"]["error"]["error_type"] == "invalid_args"
        assert snapshot(kubectl, namespace)[1] == jobs_before  # each refusal is a step, and no job
        await orch.call("jobs_cancel", job=running)
