"""The gateway answers Episode and AgentJob reads from watch-fed copies (one watch per resource): a
tool call's only API request is its step write, and the copies follow every write the operator makes
(here the test plays the operator), deletions included, and a watch whose version the API server has
forgotten (410) by listing again. No operator runs: nothing else writes these objects."""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from devstack.controlplane import cluster as devcluster
from env_gateway.cache import wait_until
from env_gateway.config import GatewaySettings
from env_gateway.kube import Kube, make_api_client
from tests.helpers import Kubectl, wait_for
from tests.integration.gateway.support import serve
from tests.integration.support import agentjob_manifest, apply, episode_manifest

EPISODE = "mirrored"
PHASES = ["Pending", "Admitted", "Running", "Succeeded"]
# How long a change may take to reach the gateway's copy on a loaded machine (a state is awaited; this
# only bounds a failure).
SEEN_WITHIN_SECONDS = 60


class Agent:
    """The agent of EPISODE over the OpenEnv `/mcp` dialect."""

    def __init__(self, http: httpx.AsyncClient) -> None:
        self.http = http
        self.calls = 0

    async def call(self, tool: str, **arguments: Any) -> dict[str, Any]:
        message = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
                   "params": {"name": tool, "arguments": arguments}}  # fmt: skip
        answer = (await self.http.post("/mcp", json=message)).json()
        self.calls += 1
        result: dict[str, Any] = answer["result"]["structuredContent"]
        return result

    async def jobs(self) -> dict[str, str]:
        """jobs_status: each job's phase by name."""
        return {j["name"]: j["phase"] for j in (await self.call("jobs_status"))["jobs"]}

    async def until(self, what: str, predicate: Any) -> list[dict[str, str]]:
        """Call jobs_status until `predicate(jobs)`; every answer seen on the way."""
        seen = [await self.jobs()]
        async with asyncio.timeout(SEEN_WITHIN_SECONDS):
            while not predicate(seen[-1]):
                seen.append(await self.jobs())
        assert predicate(seen[-1]), f"never saw {what}: {seen[-5:]}"
        return seen


@pytest.fixture
def agent_token(kubectl: Kubectl, namespace: str) -> str:
    token = secrets.token_urlsafe(24)
    digest = hashlib.sha256(token.encode()).hexdigest()
    apply(kubectl, namespace, episode_manifest(EPISODE, agentTokenHash=digest, limits={"maxSteps": 10_000}))
    return token


@pytest.fixture
def bare_gateway(
    cluster: devcluster.ClusterState, crds: None, namespace: str, agent_token: str, tmp_path: Path
) -> Iterator[str]:
    """The gateway alone (no operator, no broker): the Episode exists before it starts."""
    (tmp_path / "token").write_text("unused")
    settings = GatewaySettings(
        namespace=namespace,
        orchestrator_token=secrets.token_urlsafe(16),
        broker_url="http://127.0.0.1:9",
        broker_token_file=str(tmp_path / "token"),
        kubeconfig=str(cluster.kubeconfig),
    )
    yield from serve(settings)


@pytest.fixture
async def agent(bare_gateway: str, agent_token: str) -> AsyncIterator[Agent]:
    headers = {"Authorization": f"Bearer {agent_token}"}
    async with httpx.AsyncClient(base_url=bare_gateway, headers=headers, timeout=60) as http:
        yield Agent(http)


def set_phase(kubectl: Kubectl, namespace: str, job: str, phase: str) -> None:
    kubectl("-n", namespace, "patch", "agentjob", job, "--subresource=status", "--type=merge",
            "-p", json.dumps({"status": {"phase": phase}}))  # fmt: skip


def gateway_requests(cluster: devcluster.ClusterState, offset: int, namespace: str) -> list[str]:
    """The gateway's API requests (kubernetes_asyncio's user agent) in `namespace` since `offset`."""
    found = []
    with Path(cluster.audit_log).open("rb") as f:
        f.seek(offset)
        for line in f:
            entry = json.loads(line)
            ref = entry.get("objectRef", {})
            if ref.get("namespace") != namespace or not entry.get("userAgent", "").startswith("OpenAPI"):
                continue
            resource = ref.get("resource", "?") + ("/" + ref["subresource"] if ref.get("subresource") else "")
            found.append(f"{entry['verb']} {resource}")
    return found


async def test_jobs_status_follows_each_status_write_never_backwards_and_reads_no_api(
    agent: Agent, cluster: devcluster.ClusterState, kubectl: Kubectl, namespace: str
) -> None:
    apply(kubectl, namespace, agentjob_manifest("j1", EPISODE))
    await agent.until("the new job", lambda jobs: jobs.get("j1") == "Pending")
    offset = Path(cluster.audit_log).stat().st_size
    calls_before = agent.calls
    for phase in PHASES[1:]:
        await asyncio.to_thread(set_phase, kubectl, namespace, "j1", phase)
        seen = await agent.until(f"j1 {phase}", lambda jobs, p=phase: jobs.get("j1") == p)
        order = [PHASES.index(s["j1"]) for s in seen]
        assert order == sorted(order), f"a job's phase went backwards: {seen}"
        for _ in range(3):  # once seen, it stays
            assert (await agent.jobs())["j1"] == phase
    calls = agent.calls - calls_before

    # Each call made exactly two API requests, its step write and its provenance record: the Episode,
    # the job list and the chain's head came from the copies (the audit log is written as each request
    # completes).
    def requests() -> list[str]:
        return gateway_requests(cluster, offset, namespace)

    await asyncio.to_thread(
        wait_for,
        lambda: requests().count("create provenancerecords") >= calls,
        timeout=SEEN_WITHIN_SECONDS,
        what="the step writes and records in the audit log",
    )
    made = requests()
    assert [r for r in made if r != "watch agentjobs" and r != "watch episodes"] == [
        "patch episodes/status",
        "create provenancerecords",
    ] * calls, made


async def test_a_deleted_job_disappears_and_does_not_come_back(
    agent: Agent, kubectl: Kubectl, namespace: str
) -> None:
    apply(kubectl, namespace, agentjob_manifest("j2", EPISODE), agentjob_manifest("j3", EPISODE))
    await agent.until("both jobs", lambda jobs: {"j2", "j3"} <= set(jobs))
    kubectl("-n", namespace, "delete", "agentjob", "j2", "--wait=true")
    await agent.until("j2 gone", lambda jobs: "j2" not in jobs)
    for _ in range(3):
        assert set(await agent.jobs()) == {"j3"}
    single = await agent.call("jobs_status", job="j2")
    assert single["error"]["code"] == "job_not_found", single


def running(job: dict[str, Any]) -> bool:
    return bool((job.get("status") or {}).get("phase") == "Running")


def admitted(job: dict[str, Any]) -> bool:
    return bool((job.get("status") or {}).get("phase") == "Admitted")


async def test_the_mirror_lists_again_when_the_api_server_forgot_its_version(
    cluster: devcluster.ClusterState, crds: None, kubectl: Kubectl, namespace: str
) -> None:
    apply(kubectl, namespace, episode_manifest(EPISODE))
    apply(kubectl, namespace, agentjob_manifest("kept", EPISODE), agentjob_manifest("doomed", EPISODE))
    kube = Kube(await make_api_client(str(cluster.kubeconfig)))
    try:
        async with kube.mirrored(namespace):
            # Ready means listed: what existed before is there without waiting.
            assert kube.episodes.get(EPISODE) is not None
            assert {j["metadata"]["name"] for j in kube.agentjobs.by_index(EPISODE)} == {"kept", "doomed"}
            mirror = kube.mirrors["agentjobs"]
            assert mirror.lists == 1
            # The watch is down while the jobs change, then resumes from a version the API server no
            # longer has (as after an outage longer than its history): 410, so it must list again.
            await mirror.stop()
            await asyncio.to_thread(set_phase, kubectl, namespace, "kept", "Running")
            kubectl("-n", namespace, "delete", "agentjob", "doomed", "--wait=true")
            apply(kubectl, namespace, agentjob_manifest("born", EPISODE))
            mirror.version = "1"
            mirror.start()

            kept = await wait_until(kube.agentjobs, "kept", running, SEEN_WITHIN_SECONDS)
            assert kept is not None and running(kept), kept
            # The list that brought it replaced the whole copy at once.
            assert {j["metadata"]["name"] for j in kube.agentjobs.by_index(EPISODE)} == {"kept", "born"}
            assert mirror.lists == 2
            assert kube.agentjobs.known_gone("doomed")
            # And the resumed watch delivers what follows.
            await asyncio.to_thread(set_phase, kubectl, namespace, "born", "Admitted")
            born = await wait_until(kube.agentjobs, "born", admitted, SEEN_WITHIN_SECONDS)
            assert born is not None and admitted(born), born
    finally:
        await kube.close()
