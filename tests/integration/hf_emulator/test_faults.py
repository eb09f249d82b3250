"""Each injected fault, observed through the real client."""

from __future__ import annotations

import time

import httpx2
import pytest
from huggingface_hub import HfApi
from huggingface_hub.errors import HfHubHTTPError, JobNotFoundError

from devstack.hf_emulator import Fault, HfEmulator, routes
from tests.helpers import wait_for

from .support import install_client_timeout
from .test_jobs_api import run, wait_running, wait_terminal

SLEEPER = "import time; print('up', flush=True); time.sleep(60)"


def test_list_jobs_retries_429_honouring_ratelimit_then_succeeds(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, "print(1)", labels={"key": "k1"})
    emulator.controls.inject("rate_limit", route=routes.LIST_JOBS, seconds=0, count=2)
    listed = list(api.list_jobs(namespace=emulator.namespace, labels={"key": "k1"}))
    assert [j.id for j in listed] == [job.id]
    assert emulator.request_count(routes.LIST_JOBS) == 3
    assert emulator.faults.active() == []


def test_the_429_carries_ratelimit_headers(emulator: HfEmulator) -> None:
    emulator.controls.inject("rate_limit", route=routes.HARDWARE, seconds=55)
    with httpx2.Client(timeout=5) as client:
        response = client.get(f"{emulator.url}/api/jobs/hardware")
    assert response.status_code == 429
    assert response.headers["RateLimit"] == '"api";r=0;t=55'
    assert response.headers["RateLimit-Policy"] == '"fixed window";"api";q=500;w=300'


def test_list_jobs_retries_5xx_then_succeeds(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("http_error", route=routes.LIST_JOBS, status=503, count=1)
    assert list(api.list_jobs(namespace=emulator.namespace)) == []
    assert emulator.request_count(routes.LIST_JOBS) == 2


def test_run_job_sees_a_500_once_and_creates_nothing(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("http_error", route=routes.CREATE_JOB, status=500)
    with pytest.raises(HfHubHTTPError) as err:
        run(api, emulator, "print(1)", labels={"key": "k1"})
    assert err.value.response.status_code == 500
    assert emulator.creations_by_label("key") == {}
    run(api, emulator, "print(1)", labels={"key": "k1"})
    assert emulator.creations_by_label("key") == {"k1": 1}


def test_a_persistent_fault_lasts_until_cleared(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("http_error", route=routes.HARDWARE, status=502, count=None)
    for _ in range(3):
        with pytest.raises(HfHubHTTPError):
            api.list_jobs_hardware()
    emulator.controls.clear_faults()
    assert api.list_jobs_hardware()


def test_a_hang_hits_the_client_timeout_until_released(api: HfApi, emulator: HfEmulator) -> None:
    install_client_timeout(1.0)
    emulator.controls.inject("hang", route=routes.INSPECT_JOB, seconds=30)
    job = run(api, emulator, "print(1)")
    with pytest.raises(httpx2.ReadTimeout):
        api.inspect_job(job_id=job.id, namespace=emulator.namespace)
    emulator.controls.wait_held(routes.INSPECT_JOB, timeout=1)  # the client gave up while the server held on
    emulator.controls.release_hangs()
    assert api.inspect_job(job_id=job.id, namespace=emulator.namespace).id == job.id


def test_a_slow_answer_is_still_an_answer(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("delay", route=routes.HARDWARE, seconds=0.5)
    started = time.monotonic()
    assert api.list_jobs_hardware()
    assert time.monotonic() - started >= 0.5


def test_a_dropped_connection_is_a_transport_error(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("drop", route=routes.CREATE_JOB)
    with pytest.raises(httpx2.TransportError):
        run(api, emulator, "print(1)")
    assert emulator.job_ids() == []
    # list_jobs treats it as transient and retries.
    emulator.controls.inject("drop", route=routes.LIST_JOBS)
    assert list(api.list_jobs(namespace=emulator.namespace)) == []


def test_a_lost_response_leaves_a_created_job_behind(api: HfApi, emulator: HfEmulator) -> None:
    # The trap behind "never submit twice": the create succeeded, the client saw only an error.
    emulator.controls.inject("lose_response", route=routes.CREATE_JOB)
    with pytest.raises(httpx2.TransportError):
        run(api, emulator, "print(1)", labels={"key": "once"})
    found = list(api.list_jobs(namespace=emulator.namespace, labels={"key": "once"}))
    assert len(found) == 1
    assert emulator.creations_by_label("key") == {"once": 1}


def test_an_unhonoured_cancel_is_accepted_but_the_job_keeps_running(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, SLEEPER, labels={"key": "stuck"})
    emulator.controls.inject("cancel_ignored", labels={"key": "stuck"}, count=None)
    wait_running(api, emulator, job.id)
    for _ in range(2):
        api.cancel_job(job_id=job.id, namespace=emulator.namespace)  # 200: no error
        assert api.inspect_job(job_id=job.id, namespace=emulator.namespace).status.stage == "RUNNING"
    emulator.controls.clear_faults()
    api.cancel_job(job_id=job.id, namespace=emulator.namespace)
    assert api.inspect_job(job_id=job.id, namespace=emulator.namespace).status.stage == "CANCELED"


def test_a_job_fault_makes_a_new_job_end_in_error(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("job_error", labels={"role": "grader"}, message="node failure", seconds=0.3)
    unaffected = run(api, emulator, "print(1)", labels={"role": "agent"})
    job = run(api, emulator, SLEEPER, labels={"role": "grader"})
    done = wait_terminal(api, emulator, job.id)
    assert (done.status.stage, done.status.message) == ("ERROR", "node failure")
    assert wait_terminal(api, emulator, unaffected.id).status.stage == "COMPLETED"


def test_a_job_fault_can_hit_a_running_job(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, SLEEPER)
    wait_running(api, emulator, job.id)
    emulator.controls.add_fault(Fault(kind="job_error", job_id=job.id, message="preempted"))
    done = wait_terminal(api, emulator, job.id)
    assert (done.status.stage, done.status.message) == ("ERROR", "preempted")


def test_a_vanished_job_is_404_everywhere(api: HfApi, emulator: HfEmulator) -> None:
    job = run(api, emulator, SLEEPER, labels={"key": "gone"})
    wait_running(api, emulator, job.id)
    emulator.controls.inject("job_vanish", job_id=job.id)
    with pytest.raises(JobNotFoundError):
        api.inspect_job(job_id=job.id, namespace=emulator.namespace)
    with pytest.raises(JobNotFoundError):
        api.cancel_job(job_id=job.id, namespace=emulator.namespace)
    with pytest.raises(JobNotFoundError):
        list(api.fetch_job_logs(job_id=job.id, namespace=emulator.namespace))
    assert list(api.list_jobs(namespace=emulator.namespace, labels={"key": "gone"})) == []


def test_a_new_job_can_vanish_after_creation(api: HfApi, emulator: HfEmulator) -> None:
    emulator.controls.inject("job_vanish", labels={"key": "later"}, seconds=2)
    job = run(api, emulator, SLEEPER, labels={"key": "later"})
    assert api.inspect_job(job_id=job.id, namespace=emulator.namespace).id == job.id

    def gone() -> bool:
        try:
            api.inspect_job(job_id=job.id, namespace=emulator.namespace)
        except JobNotFoundError:
            return True
        return False

    wait_for(gone, timeout=10, interval=0.1, what=f"job {job.id} to vanish")


def test_faults_are_switchable_over_http(api: HfApi, emulator: HfEmulator) -> None:
    token = {"Authorization": f"Bearer {emulator.token}"}
    with httpx2.Client(base_url=emulator.url, timeout=5, headers=token) as admin:
        added = admin.post(
            "/_emulator/faults", json={"kind": "http_error", "route": routes.HARDWARE, "status": 504}
        )
        assert added.status_code == 200 and added.json()["id"] >= 1
        assert [f["kind"] for f in admin.get("/_emulator/faults").json()] == ["http_error"]
        with pytest.raises(HfHubHTTPError) as err:
            api.list_jobs_hardware()
        assert err.value.response.status_code == 504
        assert admin.get("/_emulator/faults").json() == []  # one-shot
        assert admin.post("/_emulator/faults", json={"kind": "nope"}).status_code == 400
        admin.post("/_emulator/faults", json={"kind": "hang", "route": routes.HARDWARE, "count": None})
        assert admin.delete("/_emulator/faults").status_code == 200
        stats = admin.get("/_emulator/stats").json()
    assert api.list_jobs_hardware()
    assert stats["requests"][routes.HARDWARE] == 1
