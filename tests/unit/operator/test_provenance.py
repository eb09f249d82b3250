"""The provenance record's pure parts: names, the chain and what breaks it, the summary, a job's
entry, and the gateway's appender against a store that keeps names unique as the API server does."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from posttrain_operator.api import provenance
from posttrain_operator.api.models import AgentJobStatus, InstalledPackage, MountedRepo
from posttrain_operator.api.provenance import GENESIS, ProvenanceSpec

from env_gateway.provenance import ProvenanceLog, tool_call


def _calls(n: int, previous: str = GENESIS, start: int = 0) -> list[ProvenanceSpec]:
    chain = []
    for sequence in range(start, start + n):
        call = tool_call("task_info", {"n": sequence}, "ok", 0, "2026-12-04T00:00:00Z", None)
        spec = ProvenanceSpec(
            format=provenance.FORMAT, episode="ep", writer="gateway", sequence=sequence,
            previous=previous, tool_calls=[call],
        )  # fmt: skip
        chain.append(spec)
        previous = provenance.digest(spec)
    return chain


def test_a_whole_chain_is_intact_in_any_order() -> None:
    chain = _calls(4)
    assert provenance.chain_break(reversed(chain)) is None
    assert provenance.summarise(chain).chain == "intact"


def test_a_missing_or_replaced_record_breaks_the_chain() -> None:
    chain = _calls(4)
    assert (
        provenance.chain_break([chain[0], chain[1], chain[3]]) == "record 2 of the tool-call chain is missing"
    )
    replaced = chain[1].model_copy(update={"tool_calls": [*chain[1].tool_calls, *chain[2].tool_calls]})
    assert (
        provenance.chain_break([chain[0], replaced, chain[2], chain[3]])
        == "record 2 does not follow record 1"
    )
    assert provenance.chain_break(chain[1:]) == "record 0 of the tool-call chain is missing"


def test_the_digest_is_of_the_canonical_spec() -> None:
    (spec,) = _calls(1)
    assert provenance.digest(spec) == provenance.digest(ProvenanceSpec.model_validate(spec.wire()))
    assert provenance.digest(spec) != provenance.digest(spec.model_copy(update={"sequence": 1}))


def test_arguments_are_recorded_by_size_and_hash_not_content() -> None:
    secret = {"script": "print('hidden')", "packages": []}
    call = tool_call("jobs_submit", secret, "ok", 12, "2026-12-04T00:00:00Z", "ep-1")
    assert "hidden" not in str(call.wire())
    assert call.argument_bytes == len('{"packages":[],"script":"print(\'hidden\')"}')
    reordered = tool_call("jobs_submit", dict(reversed(secret.items())), "ok", 12, call.at, "ep-1")
    assert reordered.arguments_sha256 == call.arguments_sha256


def test_names_stay_within_253_characters_and_apart() -> None:
    long = "e" * 253
    names = {provenance.calls_record_name(long, 0), provenance.calls_record_name(long, 1),
             provenance.job_record_name(long), provenance.submission_record_name(long)}  # fmt: skip
    assert len(names) == 4 and all(len(n) <= 253 for n in names)
    assert provenance.calls_record_name("ep", 7) == "ep-calls-000007"
    assert provenance.job_record_name("ep-3f2a") == "ep-3f2a-job"


def test_a_jobs_entry_takes_its_spec_and_final_status() -> None:
    job = {
        "metadata": {"name": "ep-1"},
        "spec": {"episode": "ep", "purpose": "train", "script": "print(1)", "flavor": "cpu-basic",
                 "timeoutSeconds": 600, "packages": ["tqdm"], "inputsFrom": ["ep-0"]},
    }  # fmt: skip
    wheel = InstalledPackage(name="tqdm", version="4.67.1", sha256="a" * 64)
    mount = MountedRepo(mount="model", repo="posttrain/tiny", revision="v3")
    status = AgentJobStatus(
        phase="Succeeded", backend="pods", backend_job_id="pt-ep-1", billed_seconds=120,
        settled_micro_usd=1000, packages=[wheel], mounts=[mount], lineage=["ep-0"], image="img:1",
    )  # fmt: skip
    entry = provenance.job_entry(job, status)
    assert entry.script_sha256 == provenance.script_sha256("print(1)")
    assert (entry.packages, entry.mounts, entry.requirements) == ([wheel], [mount], ["tqdm"])
    assert (entry.inputs_from, entry.lineage, entry.billed_seconds) == (["ep-0"], ["ep-0"], 120)
    # A job the backend never took has no backend in its record.
    rejected = provenance.job_entry(job, AgentJobStatus(phase="Rejected", backend="pods"))
    assert rejected.backend is None and rejected.backend_job_id is None


def test_the_schema_refuses_an_unknown_format() -> None:
    (spec,) = _calls(1)
    with pytest.raises(ValueError, match="format"):
        ProvenanceSpec.model_validate({**spec.wire(), "format": "posttrain.dev/provenance/v0"})


class Store:
    """Records by name: a create of a taken name fails, as on the API server."""

    def __init__(self) -> None:
        self.records: dict[str, dict[str, Any]] = {}
        self.fail_next = 0
        self.appended = asyncio.Event()
        self.lists = 0

    async def append(self, namespace: str, body: dict[str, Any]) -> bool:
        await asyncio.sleep(0)
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("the API server is away")
        if body["metadata"]["name"] in self.records:
            return False
        self.records[body["metadata"]["name"]] = body
        self.appended.set()
        return True

    async def list(self, namespace: str, episode: str) -> list[dict[str, Any]]:
        self.lists += 1
        return [r for r in self.records.values() if r["spec"]["episode"] == episode]


async def test_concurrent_calls_of_two_replicas_form_one_chain_holding_each_once() -> None:
    store = Store()
    replicas = [ProvenanceLog(store.append, store.list) for _ in range(2)]
    calls = [tool_call("task_info", {"i": i}, "ok", 0, "2026-12-04T00:00:00Z", None) for i in range(40)]
    await asyncio.gather(
        *(replicas[i % 2].record("ns", "ep", {"uid": "u"}, call) for i, call in enumerate(calls))
    )
    specs = provenance.specs_of(store.records.values())
    assert provenance.chain_break(specs) is None
    recorded = [c.arguments_sha256 for spec in specs for c in spec.tool_calls]
    assert sorted(recorded) == sorted(c.arguments_sha256 for c in calls)
    assert len(specs) < len(calls)  # batched: the callers queued behind one write share the next


async def test_the_head_is_read_once_per_episode_and_again_after_a_lost_race() -> None:
    store = Store()
    mine, other = ProvenanceLog(store.append, store.list), ProvenanceLog(store.append, store.list)
    calls = [tool_call("task_info", {"i": i}, "ok", 0, "2026-12-04T00:00:00Z", None) for i in range(5)]
    for call in calls[:3]:  # one after another, as one agent calls
        await mine.record("ns", "ep", {"uid": "u"}, call)
    assert (len(store.records), store.lists) == (3, 1)
    await other.record("ns", "ep", {"uid": "u"}, calls[3])  # takes sequence 3: mine's head is stale
    await mine.record("ns", "ep", {"uid": "u"}, calls[4])
    assert store.lists == 3  # other's first read, and mine's after its create of sequence 3 was refused
    specs = provenance.specs_of(store.records.values())
    assert provenance.chain_break(specs) is None and len(specs) == 5


async def test_a_failed_write_is_retried_and_its_callers_answered() -> None:
    store = Store()
    log = ProvenanceLog(store.append, store.list)
    store.fail_next = 1
    call = tool_call("task_info", {}, "ok", 0, "2026-12-04T00:00:00Z", None)
    with pytest.raises(ConnectionError):
        await log.record("ns", "ep", {"uid": "u"}, call)
    await store.appended.wait()  # the retry, after its backoff
    (spec,) = provenance.specs_of(store.records.values())
    assert spec.tool_calls == [call] and spec.sequence == 0
