"""The real huggingface_hub 2.4 client against the emulator: submit, status, list, logs, cancel,
prices, artifacts, validation and billing. Jobs are short `python -c` programs."""

from __future__ import annotations

import json
import os
import stat
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx2
import pytest
from huggingface_hub import HfApi, HfFileSystem, JobInfo, Volume
from huggingface_hub.errors import BadRequestError, HfHubHTTPError, JobNotFoundError

from devstack.hf_emulator import FLAVORS, HfEmulator, routes
from devstack.hf_emulator.records import REDACTED_TOKEN
from tests.helpers import wait_for

IMAGE = "ghcr.io/example/launcher:1"
TERMINAL = ("COMPLETED", "CANCELED", "ERROR", "DELETED")


def run(api: HfApi, emulator: HfEmulator, src: str, **kwargs: object) -> JobInfo:
    return api.run_job(
        image=IMAGE,
        command=["python", "-c", src],
        namespace=emulator.namespace,
        flavor="cpu-basic",
        timeout=kwargs.pop("timeout", 60),  # type: ignore[arg-type]
        **kwargs,  # type: ignore[arg-type]
    )


def wait_terminal(api: HfApi, emulator: HfEmulator, job_id: str, timeout: float = 120) -> JobInfo:
    return wait_terminal_in(api, emulator.namespace, job_id, timeout)


def wait_terminal_in(api: HfApi, namespace: str, job_id: str, timeout: float = 120) -> JobInfo:
    def terminal() -> JobInfo | None:
        info = api.inspect_job(job_id=job_id, namespace=namespace)
        return info if info.status.stage in TERMINAL else None

    info: JobInfo = wait_for(terminal, timeout, interval=0.1, what=f"job {job_id} to end")
    return info


def wait_running(api: HfApi, emulator: HfEmulator, job_id: str) -> JobInfo:
    emulator.wait_for_stage(job_id, ("RUNNING", *TERMINAL), timeout=120)
    return api.inspect_job(job_id=job_id, namespace=emulator.namespace)


def test_a_job_runs_to_completion_with_its_spec_echoed(api: HfApi, emulator: HfEmulator) -> None:
    src = "import os; print('hello', os.environ['GREETING'], os.environ['SECRET_X'], os.environ['JOB_ID'])"
    job = run(
        api, emulator, src, env={"GREETING": "world"}, secrets={"SECRET_X": "s3"}, labels={"team": "ml"}
    )

    assert job.status.stage == "SCHEDULING"
    assert len(job.id) == 24
    assert job.owner.name == emulator.namespace
    assert job.labels is not None and job.labels["team"] == "ml" and "name" in job.labels
    assert job.secrets == ["SECRET_X"]  # names only, never values
    assert job.created_at is not None and job.started_at is None

    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "COMPLETED"
    assert done.status.message is None
    assert done.started_at is not None and done.finished_at is not None
    assert done.created_at is not None and done.created_at <= done.started_at <= done.finished_at
    assert done.durations is not None and done.durations.total_secs is not None
    assert done.docker_image == IMAGE and done.flavor == "cpu-basic"
    logs = list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace))
    assert logs == [f"hello world s3 {job.id}"]


def test_the_job_environment_does_not_inherit_the_emulators(
    api: HfApi, emulator: HfEmulator, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_must_not_leak")
    job = run(api, emulator, "import os; print(sorted(k for k in os.environ if 'TOKEN' in k))")
    wait_terminal(api, emulator, job.id)
    assert list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace)) == ["[]"]


def test_nonzero_exit_is_error_with_a_message(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, "import sys; print('bad'); sys.exit(3)")
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "ERROR"
    assert done.status.message is not None and "exit code: 3" in done.status.message


def test_timeout_kills_the_job_and_ends_in_error(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, "import time; print('start', flush=True); time.sleep(600)", timeout=1)
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "ERROR"
    assert done.status.message is not None and done.status.message.startswith("timeout")
    assert done.durations is not None and done.durations.running_secs is not None
    assert done.durations.running_secs < 600  # stopped, not run to its end


def test_non_python_commands_are_accepted_but_fail_to_start(api: HfApi, emulator: HfEmulator) -> None:
    job = api.run_job(image=IMAGE, command=["bash", "-c", "true"], namespace=emulator.namespace, timeout=60)
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "ERROR"
    assert done.status.message is not None and "only python" in done.status.message


def test_list_filters_by_label_and_stage_and_follows_pagination(
    make_emulator: Callable[..., HfEmulator],
) -> None:
    emulator = make_emulator(page_size=2)
    api = HfApi(endpoint=emulator.url, token=emulator.token)
    ours = [run(api, emulator, "print(1)", labels={"key": f"k{i}", "group": "a"}) for i in range(5)]
    other = run(api, emulator, "import time; time.sleep(30)", labels={"group": "b"})
    for job in ours:
        wait_terminal(api, emulator, job.id)
    wait_running(api, emulator, other.id)
    assert emulator.creations_by_label("key") == {f"k{i}": 1 for i in range(5)}

    emulator.reset_stats()
    listed = list(api.list_jobs(namespace=emulator.namespace, labels={"group": "a"}))
    assert sorted(j.id for j in listed) == sorted(j.id for j in ours)
    assert [j.id for j in listed] == [j.id for j in reversed(ours)]  # newest first
    assert emulator.request_count(routes.LIST_JOBS) == 3  # pages of 2, 2, 1

    by_key = list(api.list_jobs(namespace=emulator.namespace, labels={"key": "k3"}))
    assert [j.id for j in by_key] == [ours[3].id]
    running = list(api.list_jobs(namespace=emulator.namespace, status="RUNNING"))
    assert [j.id for j in running] == [other.id]
    both = list(api.list_jobs(namespace=emulator.namespace, labels={"group": "b"}, status="COMPLETED"))
    assert both == []


def test_logs_replay_follow_and_tail(api: HfApi, emulator: HfEmulator) -> None:
    src = "import time\nfor i in range(6):\n    print(f'line {i}', flush=True)\n    time.sleep(0.2)"
    job = run(api, emulator, src)
    wait_running(api, emulator, job.id)

    followed = list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace, follow=True))
    assert followed == [f"line {i}" for i in range(6)]
    assert api.inspect_job(job_id=job.id, namespace=emulator.namespace).status.stage == "COMPLETED"

    replay = list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace))
    assert replay == followed
    tail = list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace, tail=2))
    assert tail == ["line 4", "line 5"]
    tail_follow = list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace, tail=3, follow=True))
    assert tail_follow == ["line 3", "line 4", "line 5"]


def test_sse_framing_and_a_single_date_header(emulator: HfEmulator) -> None:
    api = HfApi(endpoint=emulator.url, token=emulator.token)
    job = run(api, emulator, "print('a'); print('b')")
    wait_terminal(api, emulator, job.id)
    url = f"{emulator.url}/api/jobs/{emulator.namespace}/{job.id}/logs"
    with httpx2.Client(timeout=5) as client:
        response = client.get(url, headers={"Authorization": f"Bearer {emulator.token}"})
    assert response.headers.get_list("date") and len(response.headers.get_list("date")) == 1
    assert response.headers["content-type"] == "text/event-stream"
    events = [json.loads(line[len("data: ") :]) for line in response.text.split("\n\n") if line]
    assert events[0]["data"].startswith("===== Job started")
    assert [e["data"] for e in events[1:]] == ["a", "b"]
    assert all(e["timestamp"].endswith("Z") for e in events)


def test_metrics_stream_while_running_and_406_after(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, "import time; time.sleep(30)")
    wait_running(api, emulator, job.id)
    samples = list(api.fetch_job_metrics(job_id=job.id, namespace=emulator.namespace))
    assert len(samples) == 1
    assert {"cpu_usage_pct", "memory_used_bytes", "memory_total_bytes", "gpus"} <= set(samples[0])
    api.cancel_job(job_id=job.id, namespace=emulator.namespace)
    assert list(api.fetch_job_metrics(job_id=job.id, namespace=emulator.namespace)) == []


def host_pids_with(marker: str) -> set[int]:
    """Host pids of live processes whose command line holds `marker` (a job cannot tell its host
    pid: it runs in a PID namespace of its own). Zombies are dead: not counted."""
    found = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":
                    found.add(int(entry.name))
        except (FileNotFoundError, ProcessLookupError):
            continue
    return found


def sleeper(marker: str) -> str:
    """A job script whose child sleeps with `marker` on its command line, for `host_pids_with`."""
    return (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)', {marker!r}])\n"
        "time.sleep(600)\n"
    )


def wait_for_processes(marker: str, timeout: float = 120) -> set[int]:
    pids: set[int] = wait_for(
        lambda: host_pids_with(marker), timeout, interval=0.05, what=f"a process with {marker!r}"
    )
    return pids


def test_cancel_ends_every_process_of_the_job_before_it_reads_canceled(
    api: HfApi, emulator: HfEmulator
) -> None:
    marker = f"cancel-child-{uuid.uuid4().hex}"
    job = run(api, emulator, sleeper(marker))
    wait_for_processes(marker)
    api.cancel_job(job_id=job.id, namespace=emulator.namespace)

    # Cancel answers once the job is ended, or after a few seconds on a slow machine: wait for it.
    info = wait_terminal(api, emulator, job.id)
    assert info.status.stage == "CANCELED"
    assert info.finished_at is not None
    # No wait here: the emulator confirms the job's processes are gone before the stage turns terminal.
    assert host_pids_with(marker) == set()
    # Cancel is idempotent on a terminal job.
    api.cancel_job(job_id=job.id, namespace=emulator.namespace)


def test_unknown_job_is_job_not_found(api: HfApi, emulator: HfEmulator) -> None:
    with pytest.raises(JobNotFoundError):
        api.inspect_job(job_id="0" * 24, namespace=emulator.namespace)
    with pytest.raises(JobNotFoundError):
        api.cancel_job(job_id="0" * 24, namespace=emulator.namespace)


def test_hardware_prices_are_per_minute(api: HfApi) -> None:
    hardware = {h.name: h for h in api.list_jobs_hardware()}
    assert set(hardware) == set(FLAVORS)
    assert hardware["cpu-basic"].unit_cost_micro_usd == 167
    assert hardware["cpu-basic"].unit_label == "minute"
    assert hardware["a10g-small"].unit_cost_micro_usd == 16667
    assert hardware["a10g-small"].accelerator is not None
    assert hardware["a10g-small"].accelerator.model == "A10G"
    assert hardware["h200x8"].unit_cost_usd * 60 == pytest.approx(40.0, rel=1e-4)


@pytest.mark.parametrize(
    ("kwargs", "want"),
    [
        ({"flavor": "tpu-v5"}, "flavor"),
        ({"labels": {"key": "has space"}}, "label"),
        ({"labels": {"k" * 101: "v"}}, "label"),
        ({"labels": {"key": "v" * 101}}, "label"),
        ({"timeout": -5}, "timeoutSeconds"),
        ({"env": {"N": 1}}, "environment"),
        ({"command": ["python", ""]}, "command"),
        ({"command": []}, "command"),
        ({"volumes": [Volume(type="bucket", source="a/b", mount_path="relative")]}, "mountPath"),
        ({"volumes": [Volume(type="model", source="not-a-repo-id", mount_path="/m")]}, "source"),
        ({"volumes": [Volume(type="bucket", source="../etc", mount_path="/m")]}, "source"),
        ({"attempts": 0}, "attempts"),
    ],
    ids=[
        "unknown flavor",
        "label charset",
        "label key too long",
        "label value too long",
        "negative timeout",
        "non-string env value",
        "empty command item",
        "empty command",
        "relative mount path",
        "bad repo id",
        "bucket id escaping the store",
        "zero attempts",
    ],
)
def test_invalid_specs_are_bad_requests(
    api: HfApi, emulator: HfEmulator, kwargs: dict[str, object], want: str
) -> None:
    args: dict[str, object] = {
        "image": IMAGE,
        "command": ["python", "-c", "1"],
        "namespace": emulator.namespace,
    }
    args.update(kwargs)
    with pytest.raises(BadRequestError) as err:
        api.run_job(**args)  # type: ignore[arg-type]
    assert want in str(err.value)
    assert emulator.job_ids() == []


def test_missing_flavor_and_unknown_fields_are_refused(emulator: HfEmulator) -> None:
    url = f"{emulator.url}/api/jobs/{emulator.namespace}"
    headers = {"Authorization": f"Bearer {emulator.token}"}
    base = {"command": ["python"], "arguments": [], "environment": {}, "dockerImage": IMAGE}
    with httpx2.Client(timeout=5) as client:
        assert client.post(url, json=base, headers=headers).status_code == 400
        extra = {**base, "flavor": "cpu-basic", "egress": False}
        response = client.post(url, json=extra, headers=headers)
        assert response.status_code == 400 and "egress" in response.json()["error"]


def test_bad_token_is_401_and_other_namespaces_403(emulator: HfEmulator) -> None:
    bad = HfApi(endpoint=emulator.url, token="hf_wrong")
    with pytest.raises(HfHubHTTPError) as err:
        bad.whoami()
    assert err.value.response.status_code == 401
    api = HfApi(endpoint=emulator.url, token=emulator.token)
    assert api.whoami()["name"] == emulator.namespace
    with pytest.raises(HfHubHTTPError) as err:
        list(api.list_jobs(namespace="someone-else"))
    assert err.value.response.status_code == 403


def test_agent_harnesses_is_404(emulator: HfEmulator) -> None:
    with httpx2.Client(timeout=5) as client:
        assert client.get(f"{emulator.url}/api/agent-harnesses").status_code == 404


def test_volumes_are_laid_out_and_outputs_are_read_through_hffilesystem(
    api: HfApi, emulator: HfEmulator, data_dir: Path
) -> None:
    source = data_dir / "src-model"
    (source / "sub").mkdir(parents=True)
    (source / "config.json").write_text('{"hidden": 8}')
    (source / "sub" / "weights.bin").write_bytes(b"\x00\x01" * 1000)
    emulator.repos.register("model", "org/tiny", "main", source)
    bucket = f"{emulator.namespace}/outputs"
    src = (
        "import os, pathlib\n"
        "root = pathlib.Path(os.environ['POSTTRAIN_ROOT'])\n"
        "cfg = (root / 'inputs/model/config.json').read_text()\n"
        "out = root / 'outputs'\n"
        "(out / 'ckpt').mkdir()\n"
        "(out / 'result.json').write_text(cfg)\n"
        "(out / 'ckpt' / 'big.bin').write_bytes(bytes(range(256)) * 40)\n"
        "os.symlink('ckpt/big.bin', out / 'inner-link')\n"
        "print(sorted(p.name for p in (root / 'inputs/model').iterdir()))\n"
    )
    volumes = [
        Volume(type="model", source="org/tiny", mount_path="/inputs/model", revision="main"),
        Volume(type="bucket", source=bucket, mount_path="/outputs"),
    ]
    job = run(api, emulator, src, volumes=volumes)
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "COMPLETED", done.status.message
    assert list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace)) == ["['config.json', 'sub']"]
    assert done.volumes is not None and [v.mount_path for v in done.volumes] == ["/inputs/model", "/outputs"]

    # The repository copy in the job tree is read-only (the launcher's uid cannot change it).
    mounted = emulator.job_root(job.id) / "inputs" / "model"
    assert stat.S_IMODE((mounted / "config.json").stat().st_mode) == 0o444
    assert stat.S_IMODE(mounted.stat().st_mode) == 0o555
    assert stat.S_IMODE((emulator.data_dir / "repos").stat().st_mode) == 0o700

    fs = HfFileSystem(endpoint=emulator.url, token=emulator.token, skip_instance_cache=True)
    names = sorted(fs.ls(f"hf://buckets/{bucket}", detail=False))
    # A link that stays inside the outputs is published, but never served.
    assert (emulator.bucket_path(bucket) / "inner-link").is_symlink()
    assert names == [f"buckets/{bucket}/ckpt", f"buckets/{bucket}/result.json"]
    assert json.loads(fs.cat_file(f"hf://buckets/{bucket}/result.json")) == {"hidden": 8}
    with fs.open(f"hf://buckets/{bucket}/ckpt/big.bin", "rb", block_size=1000) as f:
        f.seek(5000)
        assert f.read(10) == (bytes(range(256)) * 40)[5000:5010]
    assert fs.cat_file(f"hf://buckets/{bucket}/ckpt/big.bin") == bytes(range(256)) * 40
    assert fs.info(f"hf://buckets/{bucket}/ckpt/big.bin")["size"] == 10240
    assert sorted(fs.find(f"hf://buckets/{bucket}")) == [
        f"buckets/{bucket}/ckpt/big.bin",
        f"buckets/{bucket}/result.json",
    ]
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"hf://buckets/{bucket}/inner-link")
    with pytest.raises(FileNotFoundError):
        fs.ls(f"hf://buckets/{emulator.namespace}/no-such-bucket")


@pytest.mark.parametrize(
    ("plant", "reason"),
    [
        ("os.symlink(private, out / 'escape')", "'escape' is a symbolic link to"),
        ("os.symlink('../..', out / 'sub' / 'up')", "'sub/up' is a symbolic link to '../..'"),
        ("os.mkfifo(out / 'sub' / 'pipe')", "'sub/pipe' is not a regular file"),
    ],
)
def test_outputs_that_lead_outside_themselves_are_not_published(
    api: HfApi, emulator: HfEmulator, data_dir: Path, plant: str, reason: str
) -> None:
    private = data_dir / "private"
    private.mkdir(mode=0o700)
    (private / "secret").write_text("s")
    bucket = f"{emulator.namespace}/refused"
    src = (
        "import os, pathlib\n"
        f"private = {str(private)!r}\n"
        "out = pathlib.Path(os.environ['POSTTRAIN_ROOT']) / 'outputs'\n"
        "(out / 'sub').mkdir()\n"
        "(out / 'sub' / 'ok.txt').write_text('fine')\n"
        f"{plant}\n"
    )
    job = run(api, emulator, src, volumes=[Volume(type="bucket", source=bucket, mount_path="/outputs")])
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "ERROR"
    assert done.status.message is not None
    assert done.status.message.startswith("outputs not published: ")
    assert reason in done.status.message
    assert not (emulator.bucket_path(bucket) / "sub").exists()  # nothing of it, not just the link
    assert stat.S_IMODE(private.stat().st_mode) == 0o700


def test_a_read_only_mount_of_a_bucket_holding_a_link_leaves_its_target_alone(
    api: HfApi, emulator: HfEmulator, data_dir: Path
) -> None:
    """Read-only preparation of a bucket that holds a link (put there before publication was
    checked) copies the link and chmods nothing it leads to."""
    private = data_dir / "private"
    private.mkdir(mode=0o700)
    bucket = emulator.create_bucket(f"{emulator.namespace}/old")
    (bucket / "data.txt").write_text("d")
    (bucket / "link").symlink_to(private)
    vol = Volume(type="bucket", source=f"{emulator.namespace}/old", mount_path="/in", read_only=True)
    job = run(
        api,
        emulator,
        "import os; print(sorted(os.listdir(os.environ['POSTTRAIN_ROOT'] + '/in')))",
        volumes=[vol],
    )
    assert wait_terminal(api, emulator, job.id).status.stage == "COMPLETED"
    assert list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace)) == ["['data.txt', 'link']"]
    assert stat.S_IMODE(private.stat().st_mode) == 0o700
    assert stat.S_IMODE((emulator.job_root(job.id) / "in").stat().st_mode) == 0o555


def test_a_read_only_bucket_mount_sees_earlier_outputs(api: HfApi, emulator: HfEmulator) -> None:
    bucket = emulator.create_bucket(f"{emulator.namespace}/shared")
    (bucket / "run1").mkdir()
    (bucket / "run1" / "ckpt.txt").write_text("v1")
    src = "import os; print(open(os.environ['POSTTRAIN_ROOT'] + '/in/ckpt.txt').read())"
    vol = Volume(
        type="bucket", source=f"{emulator.namespace}/shared", mount_path="/in", path="run1", read_only=True
    )
    job = run(api, emulator, src, volumes=[vol])
    assert wait_terminal(api, emulator, job.id).status.stage == "COMPLETED"
    assert list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace)) == ["v1"]


def test_an_unregistered_repository_fails_the_job(api: HfApi, emulator: HfEmulator) -> None:
    vol = Volume(type="dataset", source="org/missing", mount_path="/data-in")
    job = run(api, emulator, "print(1)", volumes=[vol])
    done = wait_terminal(api, emulator, job.id)
    assert done.status.stage == "ERROR"
    assert done.status.message is not None and "org/missing" in done.status.message


def test_billing_is_per_started_minute(make_emulator: Callable[..., HfEmulator]) -> None:
    emulator = make_emulator(scheduling_delay=0.5)
    api = HfApi(endpoint=emulator.url, token=emulator.token)
    short = run(api, emulator, "print('quick')")
    gpu = api.run_job(
        image=IMAGE,
        command=["python", "-c", "1"],
        flavor="a10g-small",
        namespace=emulator.namespace,
        timeout=60,
    )
    never_started = run(api, emulator, "print('never')")
    api.cancel_job(job_id=never_started.id, namespace=emulator.namespace)
    for job in (short, gpu):
        wait_terminal(api, emulator, job.id)

    records = {r.job_id: r for r in emulator.billing()}
    assert (records[short.id].minutes, records[short.id].cost_micro_usd) == (1, 167)
    assert (records[gpu.id].minutes, records[gpu.id].cost_micro_usd) == (1, 16667)
    assert (records[never_started.id].minutes, records[never_started.id].cost_micro_usd) == (0, 0)
    assert emulator.total_cost_micro_usd() == 167 + 16667

    with httpx2.Client(timeout=5) as client:
        usage = client.get(
            f"{emulator.url}/api/settings/billing/usage/jobs",
            headers={"Authorization": f"Bearer {emulator.token}"},
        ).json()
        admin = client.get(f"{emulator.url}/_emulator/billing", headers=admin_headers(emulator)).json()
    assert usage["hasAccess"] is True
    assert usage["usage"]["usedMicroUsd"] == 167 + 16667
    assert usage["usage"]["totalMinutes"] == 2
    assert {d["jobId"] for d in usage["usage"]["jobDetails"]} == {short.id, gpu.id}
    assert admin["totalMicroUsd"] == 167 + 16667


def test_every_request_is_recorded_for_leak_scans(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, "print(1)", env={"MODE": "eval"})
    api.inspect_job(job_id=job.id, namespace=emulator.namespace)
    recorded = emulator.requests()
    assert [r.route for r in recorded] == [routes.CREATE_JOB, routes.INSPECT_JOB]
    create = recorded[0]
    assert json.loads(create.body)["environment"] == {"MODE": "eval"}
    assert ("Authorization", f"Bearer {emulator.token}") in [(k.title(), v) for k, v in create.headers]
    where = [
        (r.route, k)
        for r in recorded
        for k, v in [*r.headers, ("body", r.body.decode())]
        if emulator.token in v and k.lower() != "authorization"
    ]
    assert where == []
    with httpx2.Client(base_url=emulator.url, timeout=5, headers=admin_headers(emulator)) as client:
        stats = client.get("/_emulator/stats").json()
        served = client.get("/_emulator/requests")
    assert stats["requests"] == {routes.CREATE_JOB: 1, routes.INSPECT_JOB: 1}
    logged = served.json()
    assert len(logged) == 2 and logged[0]["method"] == "POST"
    # Served over HTTP, the log shows where the token was, never the token.
    assert emulator.token not in served.text
    assert ["Authorization", f"Bearer {REDACTED_TOKEN}"] in [[k.title(), v] for k, v in logged[0]["headers"]]


def admin_headers(emulator: HfEmulator) -> dict[str, str]:
    return {"Authorization": f"Bearer {emulator.token}"}


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/_emulator/requests"),
        ("GET", "/_emulator/stats"),
        ("POST", "/_emulator/repos"),
        ("POST", "/_emulator/faults"),
        ("DELETE", "/_emulator/faults"),
        ("GET", "/_emulator/jobs"),
    ],
)
def test_admin_endpoints_need_the_token(emulator: HfEmulator, tmp_path: Path, method: str, path: str) -> None:
    """They register host directories as root, inject faults and serve the request log."""
    source = tmp_path / "private"
    source.mkdir()
    body = {"kind": "model", "repoId": "x/stolen", "sourceDir": str(source), "route": routes.HARDWARE}
    with httpx2.Client(base_url=emulator.url, timeout=5) as client:
        for headers in ({}, {"Authorization": "Bearer hf_wrong"}):
            refused = client.request(method, path, json=body, headers=headers)
            assert refused.status_code == 401, refused.text
        assert client.get("/_emulator/health").status_code == 200  # readiness needs no token
    assert emulator.repos.registered() == []
    assert emulator.faults.active() == []


def test_cli_serves_until_terminated_with_its_token_from_a_file(data_dir: Path, tmp_path: Path) -> None:
    import subprocess
    import sys

    token = f"hf_cli_{uuid.uuid4().hex}"
    token_file = data_dir / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    log_file = tmp_path / "emulator.log"  # everything it prints, as `stack up` keeps it
    with open(log_file, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable, "-m", "devstack.hf_emulator", "--port", "0",
                "--data-dir", str(data_dir / "cli"), "--token-file", str(token_file),
                "--interpreter", sys.executable,
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": os.getcwd()},
        )  # fmt: skip
    try:
        lines = wait_for_lines(log_file, 2, proc)
        endpoint = lines[0].removeprefix("HF_ENDPOINT=")
        api = HfApi(endpoint=endpoint, token=token)
        assert api.list_jobs_hardware()[0].name == "cpu-basic"
        assert api.whoami()["name"] == emulator_namespace(lines[1])
        with pytest.raises(HfHubHTTPError) as err:
            HfApi(endpoint=endpoint, token="hf_emulator_token").whoami()  # not the default any more
        assert err.value.response.status_code == 401
        namespace = emulator_namespace(lines[1])
        job = api.run_job(image=IMAGE, command=["python", "-c", "print('hi')"], namespace=namespace)
        assert wait_terminal_in(api, namespace, job.id).status.stage == "COMPLETED"
        with httpx2.Client(base_url=endpoint, timeout=5) as client:
            client.get("/_emulator/requests", headers={"Authorization": f"Bearer {token}"}).raise_for_status()
        # Neither on its command line nor in its environment, whatever is read from /proc.
        assert token.encode() not in Path(f"/proc/{proc.pid}/cmdline").read_bytes()
        assert token.encode() not in Path(f"/proc/{proc.pid}/environ").read_bytes()
    finally:
        proc.terminate()
        assert proc.wait(10) == 0
    # Nor anywhere in what it printed, start to stop.
    printed = log_file.read_text(errors="replace")
    assert printed.startswith("HF_ENDPOINT=")
    assert token not in printed


def wait_for_lines(path: Path, count: int, proc: Any, timeout: float = 120) -> list[str]:
    def printed() -> list[str] | None:
        lines = path.read_text(errors="replace").splitlines()
        if len(lines) >= count:
            return lines[:count]
        assert proc.poll() is None, path.read_text(errors="replace")
        return None

    lines: list[str] = wait_for(printed, timeout, interval=0.1, what=f"{count} lines printed to {path}")
    return lines


def emulator_namespace(line: str) -> str:
    return line.strip().removeprefix("namespace=")


def test_simulated_jobs_run_no_process(make_emulator: Callable[..., HfEmulator]) -> None:
    # For benchmarks with hundreds of active jobs: same API, no processes.
    emulator = make_emulator(execute=False, simulated_runtime=0.5)
    api = HfApi(endpoint=emulator.url, token=emulator.token)
    done = run(api, emulator, "this is never executed")
    stays = run(api, emulator, "neither is this")
    api.cancel_job(job_id=stays.id, namespace=emulator.namespace)
    assert wait_terminal(api, emulator, done.id).status.stage == "COMPLETED"
    assert api.inspect_job(job_id=stays.id, namespace=emulator.namespace).status.stage == "CANCELED"
    assert [r.minutes for r in emulator.billing()] == [1, 1]


def test_bucket_listings_paginate(make_emulator: Callable[..., HfEmulator]) -> None:
    emulator = make_emulator(tree_page_size=3)
    bucket = emulator.create_bucket(f"{emulator.namespace}/many")
    for i in range(7):
        (bucket / f"f{i}.txt").write_text(str(i))
    fs = HfFileSystem(endpoint=emulator.url, token=emulator.token, skip_instance_cache=True)
    names = fs.ls(f"hf://buckets/{emulator.namespace}/many", detail=False)
    assert len(names) == 7
    assert emulator.request_count(routes.BUCKET_TREE_ROOT) == 3
    with httpx2.Client(timeout=5) as client:
        bad = client.get(
            f"{emulator.url}/api/jobs/{emulator.namespace}?cursor=abc",
            headers={"Authorization": f"Bearer {emulator.token}"},
        )
    assert bad.status_code == 400
