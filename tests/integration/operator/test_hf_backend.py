"""The hf-jobs backend with the real huggingface_hub client against the emulator: the calls, the
faults and their documented outcomes, and the token that must never leave the Authorization header."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import HfApi
from posttrain_operator.api.models import MAX_SCRIPT_BYTES
from posttrain_operator.backends.base import BackendError, JobRequest, OutputMount, PackagePin, UnknownFlavor
from posttrain_operator.backends.hf_client import KEY_LABEL, HfJobsConfig, install_client_timeout
from posttrain_operator.backends.hf_jobs import HfJobsBackend

from devstack.hf_emulator import HfEmulator, routes
from devstack.hf_emulator.repos import remove_tree
from tests.helpers import Kubectl, wait_for
from tests.integration.support import (
    BUCKET,
    HF_NAMESPACE,
    HF_TOKEN,
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    make_emulator,
    wait_phase,
)
from tests.package_index import build_wheel, serve_index


@pytest.fixture
def backend_emulator() -> Iterator[HfEmulator]:
    emu, data_dir = make_emulator(execute=True)
    yield emu
    emu.stop()
    remove_tree(data_dir)


@pytest.fixture
def backend(backend_emulator: HfEmulator) -> HfJobsBackend:
    install_client_timeout(3.0)
    return HfJobsBackend(
        HfJobsConfig(
            endpoint=backend_emulator.url,
            token=HF_TOKEN,
            namespace=HF_NAMESPACE,
            image="launcher:test",
            bucket=BUCKET,
            max_backoff_s=0.2,
        )
    )


def _request(key: str, script: str = "print('hello from the job')") -> JobRequest:
    """A short agent job: the emulator runs it under the real launcher (`python -m posttrain_launcher`)."""
    return JobRequest(
        key=key,
        namespace="ns",
        episode="ep",
        job_name=key,
        flavor="cpu-basic",
        timeout_seconds=60,
        launcher_spec={
            "version": 1,
            "role": "agent",
            "script": script,
            "output_dir": "/outputs",
            "inputs": {},
        },
        outputs=OutputMount(prefix=f"ns/ep/{key}", mount_path="/outputs"),
    )


async def test_price_lookup_is_cached_and_unknown_flavors_are_clear(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    assert await backend.price("cpu-basic") == 167
    assert await backend.price("a100-large") == 41667  # $2.50 / h
    with pytest.raises(UnknownFlavor, match="unknown flavor 'gpu-9000'"):
        await backend.price("gpu-9000")
    assert backend_emulator.request_count(routes.HARDWARE) == 1


async def test_callers_queued_behind_a_failing_price_lookup_share_its_retries(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    backend_emulator.controls.inject("http_error", route=routes.HARDWARE, status=503, count=None)
    outcomes = await asyncio.gather(*(backend.price("cpu-basic") for _ in range(3)), return_exceptions=True)
    assert all(isinstance(o, BackendError) and o.transient for o in outcomes), outcomes
    # One lookup's retries, not one per caller (each would multiply a dead backend's wait).
    assert backend_emulator.request_count(routes.HARDWARE) == backend.config.max_attempts
    backend_emulator.controls.clear_faults()
    assert await backend.price("cpu-basic") == 167  # a later call asks again


async def test_submit_find_status_logs_and_artifacts(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    handle = await backend.submit(_request("k-one"))
    assert await backend.find("k-one") == type(handle)(handle.backend_job_id)
    assert await backend.find("k-none") is None
    backend_emulator.wait_for_stage(handle.backend_job_id, ("COMPLETED", "ERROR"), timeout=60)
    status = (await backend.status_many([handle]))[handle.backend_job_id]
    assert status.started_at is not None and status.finished_at is not None
    lines = await backend.logs(handle, tail=50)
    assert lines, "the launcher's log lines are served"
    # The job ran under the launcher with an output dir: whatever it wrote is readable, bounded.
    assert isinstance(await backend.artifacts(handle.output_prefix), list)


async def test_a_script_of_the_largest_size_allowed_runs(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    # 250 KiB of script, past the 128 KiB Linux allows one environment variable: the spec travels in
    # parts, and the job runs the script whole.
    filler = "# " + "é" * 40 + "\n"
    script = filler * (250 * 1024 // len(filler.encode())) + "print('ran', len(open(__file__).read()))\n"
    assert 200 * 1024 < len(script.encode()) <= MAX_SCRIPT_BYTES
    handle = await backend.submit(_request("k-large", script=script))
    backend_emulator.wait_for_stage(handle.backend_job_id, ("COMPLETED", "ERROR"), timeout=120)
    status = (await backend.status_many([handle]))[handle.backend_job_id]
    assert status.stage == "succeeded", status.message
    assert f"ran {len(script)}" in "\n".join(await backend.logs(handle, tail=20))


async def test_the_exit_code_is_the_one_the_platform_reports(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    """HF Jobs has no exit-code field: COMPLETED is 0, a failed command's ERROR message names its code,
    and an ERROR for another cause (here an injected platform failure) says nothing of it."""
    handles = {
        "ok": await backend.submit(_request("k-exit-0")),
        "three": await backend.submit(_request("k-exit-3", script="raise SystemExit(3)")),
    }
    for handle in handles.values():
        backend_emulator.wait_for_stage(handle.backend_job_id, ("COMPLETED", "ERROR"), timeout=60)
    statuses = await backend.status_many(list(handles.values()))
    ok, three = (statuses[handles[k].backend_job_id] for k in ("ok", "three"))
    assert (ok.stage, ok.exit_code) == ("succeeded", 0)
    assert (three.stage, three.exit_code) == ("failed", 3), three.message

    backend_emulator.controls.inject("job_error", count=1, message="node lost (injected)")
    lost = await backend.submit(_request("k-exit-none", script="import time; time.sleep(30)"))
    backend_emulator.wait_for_stage(lost.backend_job_id, ("ERROR",), timeout=60)
    status = (await backend.status_many([lost]))[lost.backend_job_id]
    assert (status.stage, status.exit_code) == ("failed", None), status


async def test_a_jobs_packages_come_with_their_dependencies_from_a_private_repo_the_job_mounts(
    backend_emulator: HfEmulator, tmp_path: Path
) -> None:
    """The operator resolves the job's packages with their dependencies against its index, commits the
    wheels and the hash-pinned lock to a private dataset repo, and mounts that commit: the job, which
    has no network, installs exactly those wheels, and the pins come back for the job's status."""
    requires = ["ptprobedep>=2", "numpy>=1"]  # numpy: the image's, so not staged
    probe = build_wheel(tmp_path, "ptprobe", "1.0", "from ptprobedep import VALUE\n", requires=requires)
    dependency = build_wheel(tmp_path, "ptprobedep", "2.0", "VALUE = 'staged by the operator'\n")
    other = build_wheel(tmp_path, "ptother", "1.0", "VALUE = 'another job'\n")
    wheels = {"ptprobe": [probe], "ptprobedep": [dependency], "ptother": [other]}
    with serve_index("127.0.0.1", wheels) as index:
        backend = HfJobsBackend(
            HfJobsConfig(
                endpoint=backend_emulator.url, token=HF_TOKEN, namespace=HF_NAMESPACE, image="launcher:test",
                bucket=BUCKET, max_backoff_s=0.2, package_index=index.url,
            )
        )  # fmt: skip
        request = _request("k-packages", script="import ptprobe\nprint('probe says', ptprobe.VALUE)\n")
        request.launcher_spec["packages"] = ["ptprobe==1.0"]
        # An attempt that staged other wheels under the same key and then failed (the platform refused
        # its flavor) left them in the folder; the retry stages the folder anew.
        earlier = dataclasses.replace(request, flavor="no-such-flavor", launcher_spec={
            **request.launcher_spec, "packages": ["ptother==1.0"]})  # fmt: skip
        with pytest.raises(BackendError):
            await backend.submit(earlier)
        handle = await backend.submit(request)
    digests = {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in (probe, dependency)}
    assert set(handle.packages) == {
        PackagePin("ptprobe", "1.0", digests[probe.name]),
        PackagePin("ptprobedep", "2.0", digests[dependency.name]),
    }
    backend_emulator.wait_for_stage(handle.backend_job_id, ("COMPLETED", "ERROR"), timeout=120)
    lines = await backend.logs(handle, tail=50)
    assert "probe says staged by the operator" in lines, lines
    api = HfApi(endpoint=backend_emulator.url, token=HF_TOKEN)
    repo = f"{HF_NAMESPACE}/posttrain-packages"
    assert api.repo_info(repo, repo_type="dataset").private is True
    files = set(api.list_repo_files(repo, repo_type="dataset"))
    staged = {f"jobs/k-packages/{name}" for name in (probe.name, dependency.name, "requirements.lock")}
    assert {f for f in files if f.startswith("jobs/")} == staged
    head = api.repo_info(repo, repo_type="dataset").sha
    lock = backend_emulator.repos.lookup("dataset", repo, head) / "jobs/k-packages/requirements.lock"
    assert lock.read_text() == (
        f"ptprobe==1.0 --hash=sha256:{digests[probe.name]}\n"
        f"ptprobedep==2.0 --hash=sha256:{digests[dependency.name]}\n"
    )


async def test_packages_are_never_staged_in_a_public_repo(
    backend_emulator: HfEmulator, tmp_path: Path
) -> None:
    api = HfApi(endpoint=backend_emulator.url, token=HF_TOKEN)
    public = f"{HF_NAMESPACE}/public-wheels"
    api.create_repo(public, repo_type="dataset", private=False)
    wheel = build_wheel(tmp_path, "ptother", "1.0", "VALUE = 1\n")
    with serve_index("127.0.0.1", {"ptother": [wheel]}) as index:
        backend = HfJobsBackend(
            HfJobsConfig(
                endpoint=backend_emulator.url, token=HF_TOKEN, namespace=HF_NAMESPACE, image="launcher:test",
                bucket=BUCKET, max_backoff_s=0.2, package_index=index.url, package_repo=public,
            )
        )  # fmt: skip
        request = _request("k-public")
        request.launcher_spec["packages"] = ["ptother==1.0"]
        with pytest.raises(BackendError, match="is public") as refused:
            await backend.submit(request)
    assert refused.value.transient is False
    assert await backend.find("k-public") is None
    assert not [f for f in api.list_repo_files(public, repo_type="dataset") if f.startswith("jobs/")]


async def test_packages_without_an_index_are_refused_before_anything_is_created(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    request = _request("k-no-index")
    request.launcher_spec["packages"] = ["ptprobe==1.0"]
    with pytest.raises(BackendError, match=r"the chart's hfJobs\.packageIndex") as refused:
        await backend.submit(request)
    assert refused.value.transient is False
    assert await backend.find("k-no-index") is None


async def test_status_of_many_jobs_is_one_list_call_and_of_a_few_among_many_an_inspect_each(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    backend_emulator.stop()
    emu, data_dir = make_emulator(execute=False, simulated_runtime=600.0, page_size=4)
    try:
        many = HfJobsBackend(backend.config.__class__(**{**backend.config.__dict__, "endpoint": emu.url}))
        install_client_timeout(3.0, many.stats)  # every request counted, pages included
        handles = [await many.submit(_request(f"k{i}")) for i in range(30)]
        emu.reset_stats()
        sent = many.stats.http_requests
        statuses = await many.status_many(handles)
        assert {s.stage for s in statuses.values()} == {"running"}
        assert emu.request_counts() == {routes.LIST_JOBS: 8}  # one list call, 8 pages of 4
        assert many.stats.http_requests - sent == 8 and many.stats.calls["list_jobs"] == 1
        # A cancel's check of one job (or a few) among them: cheaper one by one than the 8 pages.
        emu.reset_stats()
        few = await many.status_many(handles[:3])
        assert {s.stage for s in few.values()} == {"running"} and few.keys() == {
            h.backend_job_id for h in handles[:3]
        }
        assert emu.request_counts() == {routes.INSPECT_JOB: 3}
        # One inspect failing through every retry leaves its job out (unknown, not lost); the others
        # are still read. When none can be read, the error is raised (a cancel's check sees it).
        emu.controls.inject(
            "http_error", route=routes.INSPECT_JOB, status=503, count=many.config.max_attempts
        )
        partial = await many.status_many(handles[:3])
        assert len(partial) == 2 and {s.stage for s in partial.values()} == {"running"}
        emu.controls.inject("http_error", route=routes.INSPECT_JOB, status=503, count=None)
        emu.reset_stats()
        with pytest.raises(BackendError) as unread:
            await many.status_many(handles[:3])
        assert unread.value.transient
        # The first with its retries, the other two once each: an outage costs a request a job.
        assert emu.request_counts() == {routes.INSPECT_JOB: many.config.max_attempts + 2}
    finally:
        install_client_timeout(3.0)
        emu.stop()
        remove_tree(data_dir)


async def test_rate_limits_and_server_errors_are_retried(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    handle = await backend.submit(_request("k-retry"))
    backend_emulator.controls.inject("rate_limit", route=routes.LIST_JOBS, seconds=0, count=2)
    backend_emulator.controls.inject("http_error", route=routes.INSPECT_JOB, status=503, count=1)
    await backend.status_many([handle])
    assert backend_emulator.request_count(routes.LIST_JOBS) == 3


async def test_a_failed_submission_is_not_retried_blindly(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    backend_emulator.controls.inject("http_error", route=routes.CREATE_JOB, status=500, count=1)
    with pytest.raises(BackendError) as failure:
        await backend.submit(_request("k-500"))
    assert failure.value.transient
    assert backend_emulator.request_count(routes.CREATE_JOB) == 1


async def test_cancel_is_confirmed_only_by_an_inspected_terminal_stage(
    backend: HfJobsBackend, backend_emulator: HfEmulator
) -> None:
    handle = await backend.submit(_request("k-cancel", script="import time; time.sleep(60)"))
    backend_emulator.wait_for_stage(handle.backend_job_id, ("RUNNING",))
    backend_emulator.controls.inject("cancel_ignored", job_id=handle.backend_job_id, count=1)
    assert await backend.cancel(handle) is False
    assert await backend.cancel(handle) is True
    assert await backend.cancel(handle) is True  # idempotent: already gone


# --- the operator and the faults ---------------------------------------------------------------


def _one_job(kubectl: Kubectl, namespace: str, **spec: object) -> dict:
    apply(kubectl, namespace, episode_manifest("ep1", budget="1.00"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1", **spec))
    return wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded", "Failed"}, timeout=90)


def test_operator_retries_a_failed_create_without_submitting_twice(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    emulator.controls.inject("http_error", route=routes.CREATE_JOB, status=502, count=1)
    job = _one_job(kubectl, namespace)
    assert job["status"]["phase"] == "Succeeded"
    assert emulator.request_count(routes.CREATE_JOB) == 2
    assert list(emulator.creations_by_label(KEY_LABEL).values()) == [1]


def test_operator_adopts_a_job_whose_create_answer_was_lost(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    emulator.controls.inject("lose_response", route=routes.CREATE_JOB, count=1)
    job = _one_job(kubectl, namespace)
    assert job["status"]["phase"] == "Succeeded"
    assert list(emulator.creations_by_label(KEY_LABEL).values()) == [1]
    assert "not submitting again" in operator.logs()


def test_a_job_ending_in_error_fails_with_the_backends_reason(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    emulator.controls.inject("job_error", count=1, message="CUDA out of memory (injected)")
    job = _one_job(kubectl, namespace)
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "JobFailed")
    assert "CUDA out of memory (injected)" in job["status"]["message"]


def test_a_vanished_job_is_backend_lost_and_releases_its_reservation(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    emulator.controls.inject("job_vanish", count=1, seconds=0.5)
    job = _one_job(kubectl, namespace)
    assert (job["status"]["phase"], job["status"]["reason"]) == ("Failed", "BackendLost")
    ledger = wait_for(lambda: (book := kubectl_ledger(kubectl, namespace))["reservedMicroUSD"] == 0 and book)
    assert ledger["settledMicroUSD"] == 0
    assert operator.proc is not None and operator.proc.poll() is None, "the operator must not crash"


def test_persistent_server_errors_never_crash_the_operator(
    kubectl: Kubectl, namespace: str, operator: OperatorProcess, emulator: HfEmulator
) -> None:
    emulator.controls.inject("http_error", status=503, count=None)
    apply(kubectl, namespace, episode_manifest("ep1"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1"))
    # Each attempt is retried with backoff inside the backend (about 15 s) before kopf retries it.
    wait_for(lambda: "failed temporarily" in operator.logs(), timeout=120, what="a retried failure")
    assert operator.proc is not None and operator.proc.poll() is None
    emulator.controls.clear_faults()
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded"}, timeout=120)
    assert list(emulator.creations_by_label(KEY_LABEL).values()) == [1]
    assert job["status"]["phase"] == "Succeeded"


def kubectl_ledger(kubectl: Kubectl, namespace: str) -> dict:
    ledger: dict = get(kubectl, namespace, "episode", "ep1")["status"]["ledger"]
    return ledger


TOKENISH = re.compile(r"(hf_[A-Za-z0-9]{10,}|token|secret)", re.IGNORECASE)


def test_the_token_is_only_ever_in_the_authorization_header(
    kubectl: Kubectl, namespace: str, executing_operator: OperatorProcess, executing_emulator: HfEmulator,
    tmp_path: Path,
) -> None:  # fmt: skip
    apply(kubectl, namespace, episode_manifest("ep1", budget="0.05"))
    wait_phase(kubectl, namespace, "episode", "ep1", {"Running"})
    script = "import os, json\nprint(json.dumps(sorted(os.environ)))\n"
    apply(kubectl, namespace, agentjob_manifest("job1", "ep1", script=script, timeoutSeconds=120))
    job = wait_phase(kubectl, namespace, "agentjob", "job1", {"Succeeded", "Failed"}, timeout=90)
    assert job["status"]["phase"] == "Succeeded"

    requests = executing_emulator.requests()
    assert any(r.route == routes.CREATE_JOB for r in requests)
    for request in requests:
        for name, value in request.headers:
            if HF_TOKEN in value:
                assert name.lower() == "authorization" and value == f"Bearer {HF_TOKEN}"
        assert HF_TOKEN not in request.path and HF_TOKEN.encode() not in request.body
    for create in (r for r in requests if r.route == routes.CREATE_JOB):
        body = json.loads(create.body)
        assert not body.get("secrets"), "a job spec carried secrets"
        for key, value in body["environment"].items():
            assert not TOKENISH.search(key), key
            assert not re.search(r"hf_[A-Za-z0-9]{10,}", value), f"{key} looks like a token"
    # Nor in the job itself, its status, or the operator's logs.
    job_env_dump = "\n".join(executing_emulator.job(job["status"]["backendJobId"]).get("logs", []))
    assert HF_TOKEN not in job_env_dump
    assert HF_TOKEN not in json.dumps(job) and HF_TOKEN not in executing_operator.logs()
    events = kubectl("-n", namespace, "get", "events", "-o", "json").stdout
    assert HF_TOKEN not in events
