"""Pure parts of the gateway: spend and limits from an Episode body, group-commit step counting,
credential parsing, strict tool arguments, and the wire shapes both OpenEnv generations read."""

from __future__ import annotations

import asyncio
import base64
import gc
import json
from datetime import UTC, datetime
from typing import Any

import aiohttp
import pytest
from kubernetes_asyncio.client.exceptions import ApiException
from pydantic import ValidationError
from starlette.datastructures import Headers

from env_gateway.auth import bearer, orchestrator_credential
from env_gateway.config import GatewaySettings
from env_gateway.episode_view import EpisodeView
from env_gateway.kube import Conflict, Unavailable, _retry_then_type_failures
from env_gateway.main import _frozen_heap
from env_gateway.parsed_views import PARSED_VIEWS, ParsedViews
from env_gateway.schemas import JobsWaitArgs, Outcome, SubmitJobArgs, ToolFailure
from env_gateway.steps import CallRefused, StepCounter, StepLimitReached
from env_gateway.surface import host_allowed
from env_gateway.wire import mcp_call_result, step_payload
from graders.tasks import get_task

NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def episode(steps: int = 0, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ns", "name": "ep", "resourceVersion": "1"},
        "spec": {"task": "t0_artifact", "budgetUSD": "0.05", "backend": "hf-jobs", "limits": {"maxSteps": 3}},
        "status": {"steps": steps, **status},
    }


def test_spend_and_limits_come_from_the_ledger_and_the_deadline() -> None:
    body = episode(
        steps=1,
        phase="Running",
        deadline="2026-01-01T12:00:30Z",
        ledger={
            "budgetMicroUSD": 50_000, "reservedMicroUSD": 5_000, "settledMicroUSD": 1_000,
            "entries": {"a": {"reservedMicroUSD": 5_000}, "b": {"settledMicroUSD": 1_000},
                        "score": {"platform": True}},
        },
    )  # fmt: skip
    view = EpisodeView.of(body, get_task("t0_artifact"))
    meta = view.metadata(NOW)
    assert meta["service_spend"] == {
        "budget_usd": "0.05", "reserved_usd": "0.005", "settled_usd": "0.001", "remaining_usd": "0.044",
        "jobs_running": 1,
    }  # fmt: skip
    assert meta["steps_left"] == 2 and meta["seconds_left"] == 30
    assert view.reward is None and not view.done


@pytest.mark.parametrize(
    ("status", "want_done", "want_reward"),
    [
        ({"phase": "Completed", "outcome": "Scored", "reward": "1"}, True, 1.0),
        ({"phase": "Completed", "outcome": "GraderFailed"}, True, None),
        ({"phase": "Scoring"}, False, None),
    ],
    ids=["scored-gives-a-number", "grader-failure-gives-null", "scoring-is-not-done"],
)
def test_done_and_reward(status: dict[str, Any], want_done: bool, want_reward: float | None) -> None:
    view = EpisodeView.of(episode(**status), get_task("t0_artifact"))
    assert (view.done, view.reward) == (want_done, want_reward)


def test_the_rewards_interval_reaches_the_trainer_once_the_episode_ends() -> None:
    interval = {"low": "0.38", "high": "0.44"}
    scored = {"phase": "Completed", "outcome": "Scored", "reward": "0.41", "rewardInterval": interval}
    meta = EpisodeView.of(episode(**scored), get_task("t0_artifact")).metadata(NOW)
    assert (meta["reward_decimal"], meta["reward_interval"]) == ("0.41", ["0.38", "0.44"])
    running = EpisodeView.of(episode(phase="Running"), get_task("t0_artifact")).metadata(NOW)
    assert running["reward_interval"] is None


def test_a_body_is_parsed_once_and_a_new_version_or_object_is_parsed_again() -> None:
    views = ParsedViews()
    body = episode(steps=1)
    view = views.parse(body)
    assert views.parse(body) is view  # the same body object: the view parsed before
    assert view.metadata(NOW) is not view.metadata(NOW)  # callers add to it: a new dict each time
    # A write's answer (e.g. Kube.set_steps): a new object with a new resourceVersion.
    written = {**body, "metadata": {**body["metadata"], "resourceVersion": "2"}, "status": {"steps": 2}}
    again = views.parse(written)
    assert again is not view and again.status.steps == 2 and again.steps_left == 1
    assert views.parse(body) is view  # the older version is still held for callers in flight
    # Another object with the same name and version is parsed on its own, never served another's view.
    lookalike = episode(steps=0)
    assert views.parse(lookalike) is not view and views.parse(lookalike).status.steps == 0
    # Without a resourceVersion nothing is kept.
    unversioned = episode(steps=1)
    del unversioned["metadata"]["resourceVersion"]
    assert views.parse(unversioned) is not views.parse(unversioned)
    # The pure parse keeps nothing: each call is a new view.
    assert EpisodeView.parse(body) is not EpisodeView.parse(body)


def test_the_parsed_views_are_bounded() -> None:
    views = ParsedViews()
    bodies = [episode() for _ in range(PARSED_VIEWS + 10)]
    for i, body in enumerate(bodies):
        body["metadata"]["name"] = f"ep-{i}"
    parsed = [views.parse(body) for body in bodies]
    assert len(views) == PARSED_VIEWS
    assert views.parse(bodies[-1]) is parsed[-1]
    assert views.parse(bodies[0]) is not parsed[0]  # the oldest parsed went first


def test_the_heap_is_frozen_while_the_app_serves_and_unfrozen_after() -> None:
    gc.unfreeze()
    with _frozen_heap():
        assert gc.get_freeze_count() > 0  # what was built is out of the collector's reach
    assert gc.get_freeze_count() == 0


class FakeStore:
    def __init__(self, steps: int, max_steps: int, conflicts: int = 0) -> None:
        self.body = episode(steps)
        self.body["spec"]["limits"]["maxSteps"] = max_steps
        self.writes: list[int] = []
        self.conflicts = conflicts
        self.wrote = asyncio.Event()  # set by every write that reaches the store

    async def read(self, namespace: str, name: str) -> dict[str, Any]:
        return self.body

    async def write(self, namespace: str, name: str, current: dict[str, Any], steps: int) -> dict[str, Any]:
        await asyncio.sleep(0.001)
        if self.conflicts or current["status"]["steps"] != self.body["status"]["steps"]:
            self.conflicts = max(0, self.conflicts - 1)
            self.body = {**self.body, "status": {"steps": self.body["status"]["steps"]}}
            raise Conflict("moved")
        self.body = {**self.body, "status": {"steps": steps}}
        self.writes.append(steps)
        self.wrote.set()
        return self.body


async def test_concurrent_steps_are_granted_exactly_up_to_the_limit_in_few_writes() -> None:
    store = FakeStore(steps=0, max_steps=30)
    counter = StepCounter(store.read, store.write, lambda b: int(b["spec"]["limits"]["maxSteps"]))
    results = await asyncio.gather(
        *(counter.take("ns", "ep", store.body) for _ in range(50)), return_exceptions=True
    )
    granted = [r for r in results if isinstance(r, dict)]
    refused = [r for r in results if isinstance(r, StepLimitReached)]
    assert len(granted) == 30 and len(refused) == 20
    assert store.body["status"]["steps"] == 30
    assert len(store.writes) < 30  # batched: many callers per write


async def test_a_conflict_rereads_and_still_counts_exactly() -> None:
    store = FakeStore(steps=2, max_steps=10, conflicts=2)
    counter = StepCounter(store.read, store.write, lambda b: int(b["spec"]["limits"]["maxSteps"]))
    stale = episode(0)
    written = await counter.take("ns", "ep", stale)
    assert written["status"]["steps"] == 3


class FlakyStore(FakeStore):
    """A FakeStore whose API server goes away: the next write fails after it `landed` or was `lost`,
    and while `away` every request fails."""

    def __init__(self, steps: int, max_steps: int) -> None:
        super().__init__(steps, max_steps)
        self.next_write: str | None = None
        self.away = False

    async def read(self, namespace: str, name: str) -> dict[str, Any]:
        if self.away:
            raise Unavailable("away", 1)
        return self.body

    async def write(self, namespace: str, name: str, current: dict[str, Any], steps: int) -> dict[str, Any]:
        failure, self.next_write = self.next_write, None
        if self.away or failure == "lost":
            self.wrote.set()
            raise Unavailable("connection refused", 1)
        written = await super().write(namespace, name, current, steps)
        if failure == "landed":
            raise Unavailable("the answer was lost", 1)
        return written


def counter_of(store: FakeStore) -> StepCounter:
    return StepCounter(store.read, store.write, lambda b: int(b["spec"]["limits"]["maxSteps"]))


@pytest.mark.parametrize("failure", ["landed", "lost"])
async def test_a_step_write_whose_answer_is_lost_counts_only_the_calls_that_ran(failure: str) -> None:
    store = FlakyStore(steps=0, max_steps=100)
    counter = counter_of(store)
    store.next_write = failure
    takes = (counter.take("ns", "ep", store.body) for _ in range(3))
    refused = await asyncio.gather(*takes, return_exceptions=True)
    assert all(isinstance(r, Unavailable) for r in refused)
    assert store.body["status"]["steps"] == (3 if failure == "landed" else 0)
    # While the server is still away nothing can be settled, and nothing is counted.
    store.away = True
    with pytest.raises(Unavailable):
        await counter.take("ns", "ep", store.body)
    store.away = False
    # The next call reads the count back first: a write that landed is taken off with its own.
    written = await counter.take("ns", "ep", store.body)
    assert written["status"]["steps"] == store.body["status"]["steps"] == 1


async def test_a_step_given_back_comes_off_with_the_next_write_even_at_the_limit() -> None:
    store = FakeStore(steps=0, max_steps=2)
    counter = counter_of(store)
    first = await counter.take("ns", "ep", store.body)
    await counter.take("ns", "ep", first)
    assert store.body["status"]["steps"] == 2
    store.wrote.clear()
    counter.give_back("ns", "ep", store.body)  # the second call failed on the platform's side
    await asyncio.wait_for(store.wrote.wait(), 10)  # the give-back's own write
    assert store.writes == [1, 2, 1] and store.body["status"]["steps"] == 1
    # And a give-back the server could not take is paid by the next call's write, beside its step.
    flaky = FlakyStore(steps=5, max_steps=10)
    counter = counter_of(flaky)
    flaky.away = True
    counter.give_back("ns", "ep", flaky.body)
    await asyncio.wait_for(flaky.wrote.wait(), 10)  # its write is refused: it waits for the next call
    flaky.away = False
    written = await counter.take("ns", "ep", flaky.body)
    assert written["status"]["steps"] == 5 and flaky.writes == [5]


async def test_no_step_is_counted_on_an_episode_that_ended_after_the_callers_copy() -> None:
    store = FakeStore(steps=1, max_steps=10)
    ended = {**store.body, "status": {"steps": 1, "phase": "Completed"}}
    counter = StepCounter(
        store.read,
        store.write,
        lambda b: 10,
        lambda b: ToolFailure("episode_done", "ended") if b["status"].get("phase") == "Completed" else None,
    )
    store.body = ended
    with pytest.raises(CallRefused) as refused:
        await counter.take("ns", "ep", ended)
    assert refused.value.body is ended and isinstance(refused.value.reason, ToolFailure)
    assert store.writes == [] and store.body["status"]["steps"] == 1


def test_credentials_parse_bearer_and_basic_userinfo() -> None:
    assert bearer("Bearer abc") == "abc" and bearer("bearer abc") == "abc"
    assert bearer(None) is None and bearer("Basic abc") is None and bearer("Bearer ") is None
    assert bearer("Bearer " + "x" * 10_000) is None
    basic = base64.b64encode(b"orchestrator:s3cret").decode()
    assert orchestrator_credential(Headers({"authorization": f"Basic {basic}"})) == "s3cret"
    assert orchestrator_credential(Headers({"authorization": "Basic !!!"})) is None
    assert orchestrator_credential(Headers({})) is None


def test_host_allowlist_matches_the_sdk_rule() -> None:
    patterns = ["127.0.0.1:*", "gateway.svc"]
    assert host_allowed("127.0.0.1:8000", patterns) and host_allowed("gateway.svc", patterns)
    assert not host_allowed("127.0.0.1.evil:80", patterns) and not host_allowed("evil", patterns)
    assert not host_allowed(None, patterns)


@pytest.mark.parametrize(
    "args",
    [
        {"script": "x", "unknown": 1},
        {"script": "x", "timeout_seconds": "600"},
        {"script": "x", "timeout_seconds": 30},
        {"script": ""},
        {"script": "x" * (256 * 1024 + 1)},
        {"script": "é" * (256 * 1024)},  # 262,144 characters, 524,288 bytes
        {"script": "x", "packages": ["p"] * 33},
        {"script": "x", "flavor": "GPU; rm -rf"},
    ],
    ids=["unknown-key", "string-number", "too-short-timeout", "empty-script", "script-too-big",
         "script-too-many-bytes", "too-many-packages", "bad-flavor"],
)  # fmt: skip
def test_jobs_submit_arguments_are_strict_and_bounded(args: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        SubmitJobArgs.model_validate(args)


def test_jobs_wait_is_bounded_by_default_below_the_mcp_sdks_read_timeout() -> None:
    with pytest.raises(ValidationError):
        JobsWaitArgs.model_validate({"timeout_seconds": 3601})
    with pytest.raises(ValidationError, match="give job or jobs, not both"):
        JobsWaitArgs.model_validate({"job": "a", "jobs": ["b"]})
    assert JobsWaitArgs.model_validate({}).timeout_seconds <= 25  # for clients that give up at 30 s
    # The tool waits at most this long: under the 300 s an MCP SDK client reads for by default.
    assert GatewaySettings.model_fields["max_wait_seconds"].default < 300


def test_wire_shapes_carry_metadata_twice_and_a_two_key_error() -> None:
    ok = Outcome(tool_name="jobs_status", result={"jobs": []}, metadata={"steps_left": 3})
    payload = step_payload(ok)
    assert payload["metadata"] == payload["observation"]["metadata"] == {"steps_left": 3}
    assert payload["observation"]["result"]["data"] == {"jobs": []} and "reward" not in payload["observation"]
    failed = Outcome(tool_name="x", error=ToolFailure("budget_exceeded", "needs $1", details={"a": 1}))
    error = step_payload(failed)["observation"]["error"]
    assert set(error) == {"error_type", "message"} and error["error_type"] == "execution_error"
    mcp = mcp_call_result(failed)
    assert mcp["isError"] and mcp["structuredContent"]["error"]["code"] == "budget_exceeded"


def test_the_script_limit_is_bytes_and_a_script_at_it_passes() -> None:
    assert SubmitJobArgs.model_validate({"script": "é" * (128 * 1024)})  # exactly 262,144 bytes
    with pytest.raises(ValidationError, match="larger than 262144 bytes"):
        SubmitJobArgs.model_validate({"script": "é" * (128 * 1024) + "x"})


async def test_more_steps_owed_than_counted_are_dropped_not_spun_on() -> None:
    """A count lowered by hand below what the counter owes back: the excess is dropped, and the
    flusher ends (it must never loop without awaiting)."""
    store = FakeStore(steps=1, max_steps=10)
    counter = counter_of(store)
    store.wrote.clear()
    for _ in range(3):
        counter.give_back("ns", "ep", store.body)
    await asyncio.wait_for(store.wrote.wait(), 10)
    assert store.body["status"]["steps"] == 0 and store.writes == [0]
    written = await asyncio.wait_for(counter.take("ns", "ep", store.body), 10)
    assert written["status"]["steps"] == 1 and counter._queues == {}


FAILURE_IDS = ["no-connection", "disconnected", "timeout", "503", "504", "rbac-403", "quota-403"]
FAILURE_IDS += ["404", "409", "422"]
QUOTA_DENIAL = "exceeded quota: agentjobs, requested: count/agentjobs.posttrain.dev=1"
RBAC_DENIAL = 'User "system:serviceaccount:ns:gw" cannot patch resource "episodes"'


def _forbidden(message: str) -> ApiException:
    exc = ApiException(status=403, reason="Forbidden")
    exc.body = json.dumps({"kind": "Status", "reason": "Forbidden", "message": f"x is forbidden: {message}"})
    return exc


@pytest.mark.parametrize(
    ("failure", "typed", "applied"),
    [
        (aiohttp.ClientConnectorError(None, OSError(111, "refused")), Unavailable, False),  # never sent
        (aiohttp.ServerDisconnectedError(), Unavailable, True),  # the answer was lost
        (TimeoutError(), Unavailable, True),
        (ApiException(status=503, reason="Service Unavailable"), Unavailable, False),
        (ApiException(status=504, reason="Gateway Timeout"), Unavailable, True),
        (_forbidden(RBAC_DENIAL), Unavailable, False),
        (_forbidden(QUOTA_DENIAL), ApiException, None),
        (ApiException(status=404, reason="Not Found"), ApiException, None),
        (ApiException(status=409, reason="Conflict"), ApiException, None),
        (ApiException(status=422, reason="Unprocessable Entity"), ApiException, None),
    ],
    ids=FAILURE_IDS,
)
async def test_the_api_clients_failures_are_typed_unavailable_only_when_about_the_server(
    failure: Exception, typed: type[Exception], applied: bool | None
) -> None:
    """What the server says about itself (away, failing, not yet authorizing the gateway) is
    Unavailable, saying whether a write may have landed; what it says about the request stays the
    client's answer, for Kube to map."""

    class Rest:
        async def request(self, *args: Any, **kwargs: Any) -> Any:
            raise failure

    rest = Rest()
    _retry_then_type_failures(rest)
    with pytest.raises(typed) as caught:
        await rest.request("POST", "https://api.example")
    if isinstance(caught.value, Unavailable):
        assert caught.value.maybe_applied is applied
