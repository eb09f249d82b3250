"""Jobs run under the real launcher (`python -m posttrain_launcher`), as the hf-jobs backend submits them."""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from huggingface_hub import HfApi, HfFileSystem, Volume

from devstack.hf_emulator import HfEmulator

from .test_jobs_api import IMAGE, host_pids_with, sleeper, wait_for_processes, wait_terminal

launcher = pytest.importorskip("posttrain_launcher")


@pytest.fixture
def emu(make_emulator: Callable[..., HfEmulator], job_python: str, data_dir: Path) -> HfEmulator:
    emulator = make_emulator(interpreter=job_python)
    source = data_dir / "model-src"
    source.mkdir()
    (source / "config.json").write_text('{"layers": 2}')
    emulator.repos.register("model", "org/tiny", "main", source)
    return emulator


def submit(emu: HfEmulator, script: str, bucket: str, **spec: object) -> str:
    job_spec = launcher.JobSpec(
        role="agent", script=script, inputs={"model": "/inputs/model"}, output_dir="/outputs", **spec
    )
    api = HfApi(endpoint=emu.url, token=emu.token)
    job = api.run_job(
        image=IMAGE,
        command=["python", "-m", "posttrain_launcher"],
        env={"POSTTRAIN_JOB_SPEC": job_spec.to_json()},
        secrets={},
        flavor="cpu-basic",
        timeout=120,
        labels={"role": "agent"},
        volumes=[
            Volume(type="model", source="org/tiny", mount_path="/inputs/model", revision="main"),
            Volume(type="bucket", source=bucket, mount_path="/outputs"),
        ],
        namespace=emu.namespace,
    )
    return job.id


AGENT = """
import json, os, pathlib
model = pathlib.Path(os.environ["POSTTRAIN_INPUT_MODEL"])
out = pathlib.Path(os.environ["POSTTRAIN_OUTPUT_DIR"])
try:
    (model / "config.json").write_text("tampered")
    input_writable = True
except OSError:
    input_writable = False
try:
    os.listdir("@@REPOS@@")
    store_listable = True
except OSError:
    store_listable = False
(out / "result.json").write_text(json.dumps({
    "uid": os.getuid(),
    "config": json.loads((model / "config.json").read_text()),
    "input_writable": input_writable,
    "store_listable": store_listable,
}))
print("agent done")
"""


def test_a_launcher_job_reads_its_model_and_publishes_outputs(emu: HfEmulator) -> None:
    bucket = f"{emu.namespace}/agent-out"
    job_id = submit(emu, AGENT.replace("@@REPOS@@", str(emu.data_dir / "repos")), bucket)
    api = HfApi(endpoint=emu.url, token=emu.token)
    done = wait_terminal(api, emu, job_id, timeout=90)
    logs = list(api.fetch_job_logs(job_id=job_id, namespace=emu.namespace))
    assert done.status.stage == "COMPLETED", (done.status.message, logs)
    assert "agent done" in logs

    fs = HfFileSystem(endpoint=emu.url, token=emu.token, skip_instance_cache=True)
    result = json.loads(fs.cat_file(f"hf://buckets/{bucket}/result.json"))
    assert result["config"] == {"layers": 2}
    assert result["input_writable"] is False
    if os.geteuid() != 0:
        pytest.skip(
            "the job runs as uid 10000, out of the repo store's reach, only when the emulator is root"
        )
    assert result["uid"] == 10000
    assert result["store_listable"] is False


def test_a_refused_spec_ends_in_error(emu: HfEmulator) -> None:
    api = HfApi(endpoint=emu.url, token=emu.token)
    job = api.run_job(
        image=IMAGE,
        command=["python", "-m", "posttrain_launcher"],
        env={"POSTTRAIN_JOB_SPEC": '{"version": 1}'},
        timeout=60,
        namespace=emu.namespace,
    )
    done = wait_terminal(api, emu, job.id, timeout=60)
    assert done.status.stage == "ERROR"
    assert done.status.message is not None and "exit code: 2" in done.status.message
    logs = list(api.fetch_job_logs(job_id=job.id, namespace=emu.namespace))
    assert any(line.startswith("posttrain-launcher: error:") for line in logs)


def test_cancel_stops_the_job_the_launcher_runs(emu: HfEmulator) -> None:
    marker = f"launcher-cancel-{uuid.uuid4().hex}"
    job_id = submit(emu, sleeper(marker), f"{emu.namespace}/cancel-out")
    wait_for_processes(marker)
    api = HfApi(endpoint=emu.url, token=emu.token)
    api.cancel_job(job_id=job_id, namespace=emu.namespace)
    assert wait_terminal(api, emu, job_id).status.stage == "CANCELED"
    assert host_pids_with(marker) == set()
