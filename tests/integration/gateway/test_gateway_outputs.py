"""What an agent reads of a job's outputs, through the gateway, on jobs that really ran under the
launcher: the end of a long log (and its head, and the whole of it in the outputs), and one text file
of the outputs, refused with a clear error when it is not a file of its own job's outputs that fits."""

from __future__ import annotations

from typing import Any

from tests.integration.gateway.agent_steps import finished, result
from tests.integration.gateway.support import GatewayServer, orchestrator

# 50 MiB of numbered lines, then a last one; a metrics file, a file past the read cap, a binary file.
WRITER = """
import json, os, sys
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
line = "x" * 90
for i in range(50 * 1024 * 1024 // 100):
    sys.stdout.write(f"{i:08d} {line}\\n")
print("final loss 0.125")
json.dump({"loss": 0.125, "steps": 3}, open(os.path.join(out, "metrics.json"), "w"))
os.makedirs(os.path.join(out, "eval"))
open(os.path.join(out, "eval", "notes.txt"), "w").write("nested\\n")
open(os.path.join(out, "big.txt"), "w").write("y" * (300 * 1024))
open(os.path.join(out, "weights.bin"), "wb").write(bytes(range(256)) * 4)
"""
# Links out of the outputs, to a file of the job's image and to the directory above.
LINKER = """
import os
out = os.environ["POSTTRAIN_OUTPUT_DIR"]
open(os.path.join(out, "metrics.json"), "w").write("{}")
os.symlink("/etc/passwd", os.path.join(out, "passwd"))
os.symlink("..", os.path.join(out, "up"))
"""


def error_code(step: dict[str, Any]) -> str:
    assert step["observation"]["error"] is not None, step["observation"]
    code: str = step["metadata"]["error_code"]
    return code


async def test_an_agent_reads_the_end_of_a_long_log_and_its_jobs_own_text_files(
    executing_gateway: GatewayServer,
) -> None:
    async with orchestrator(executing_gateway) as orch:
        await orch.reset(task="t0_artifact", budget_usd="0.05")
        other = result(await orch.call("jobs_submit", script="print(1)", timeout_seconds=120))["job"]["name"]
        await finished(orch, other)  # the task runs two jobs at once
        name = result(await orch.call("jobs_submit", script=WRITER, timeout_seconds=600))["job"]["name"]
        linker = result(await orch.call("jobs_submit", script=LINKER, timeout_seconds=120))["job"]["name"]
        job = await finished(orch, name)
        assert job["phase"] == "Succeeded", (job["message"], result(await orch.call("jobs_logs", job=name)))

        logs = result(await orch.call("jobs_logs", job=name))
        assert logs["lines"][-1] == "final loss 0.125"  # the end of a 50 MiB log
        # The kept end is whole lines in order up to the last (the head: tests/integration/launcher).
        last = result(await orch.call("jobs_logs", job=name, tail=1000))["lines"]
        count = 50 * 1024 * 1024 // 100
        assert last[:-1] == [f"{i:08d} {'x' * 90}" for i in range(count - 999, count)]
        sizes = {a["path"]: a["size"] for a in job["artifacts"]}
        # The whole log is in the outputs: every line, within its 64 MiB copy.
        assert sizes["posttrain-job.log"] == 50 * 1024 * 1024 // 100 * 100 + len("final loss 0.125\n")

        metrics = result(await orch.call("jobs_read_artifact", job=name, path="metrics.json"))
        assert (metrics["text"], metrics["size"]) == ('{"loss": 0.125, "steps": 3}', 27)
        nested = result(await orch.call("jobs_read_artifact", job=name, path="eval/notes.txt"))
        assert nested["text"] == "nested\n"

        refusals = {
            "../metrics.json": "artifact_refused",
            "eval/../metrics.json": "artifact_refused",
            "/etc/passwd": "artifact_refused",
            "big.txt": "artifact_refused",
            "weights.bin": "artifact_refused",
            "missing.json": "artifact_not_found",
            "posttrain-job.log": "artifact_refused",  # 50 MiB: past the read cap
        }
        for path, expected in refusals.items():
            step = await orch.call("jobs_read_artifact", job=name, path=path)
            assert error_code(step) == expected, (path, step)
        # Outputs holding a link out are never published: the job fails, and nothing can be read.
        linked = await finished(orch, linker)
        assert linked["phase"] == "Failed" and "symbolic link" in (linked["message"] or ""), linked
        for path in ("passwd", "up/metrics.json", "metrics.json"):
            step = await orch.call("jobs_read_artifact", job=linker, path=path)
            assert error_code(step) in ("artifact_not_found", "artifact_refused"), (path, step)
        small_log = result(await orch.call("jobs_read_artifact", job=other, path="posttrain-job.log"))
        assert small_log["text"] == "1\n"

        # A job of another episode is not this agent's to read, whatever its name.
        await orch.reset(task="t0_artifact", budget_usd="0.05")
        step = await orch.call("jobs_read_artifact", job=name, path="metrics.json")
        assert error_code(step) == "job_not_found"
