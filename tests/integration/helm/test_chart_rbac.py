"""The chart's RBAC is enough and minimal: a whole t0_artifact episode runs through the gateway and
the operator, each with only its chart ServiceAccount's credentials, without a single 403; a listed
set of actions is denied to each; and the admission policy refuses `score` AgentJobs from anyone but
the operator."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
from posttrain_operator.api import provenance
from posttrain_operator.api.episode import ProvenanceSummary
from posttrain_operator.backends.hf_replies import label_value

from devstack.controlplane import cluster as devcluster
from devstack.hf_emulator import HfEmulator
from env_gateway.provenance import tool_call
from tests.helpers import Kubectl, wait_for
from tests.integration.gateway.support import GatewayServer, Orchestrator, orchestrator
from tests.integration.helm.support import ChartOperator, Release
from tests.integration.operator.test_full_episode import ARTIFACT_SCRIPT
from tests.integration.support import agentjob_manifest, apply, episode_manifest, get, wait_phase

SLEEPER = "import time\ntime.sleep(600)\n"
# An agent job trying to append to its Episode's provenance: with whatever credential it can find, at
# the API server's address (which the test gives it, as an agent could guess it).
FORGER = """
import glob, json, os, socket, ssl, urllib.request
server, namespace, episode = {server!r}, {namespace!r}, {episode!r}
found = {{k: v for k, v in os.environ.items() if "KUBERNETES" in k or "TOKEN" in k}}
found["service_account_files"] = glob.glob("/var/run/secrets/kubernetes.io/serviceaccount/*")
record = {{"apiVersion": "posttrain.dev/v1alpha1", "kind": "ProvenanceRecord",
          "metadata": {{"name": episode + "-calls-999999"}},
          "spec": {{"format": "posttrain.dev/provenance/v1", "episode": episode, "writer": "gateway",
                   "sequence": 999999, "toolCalls": []}}}}
url = f"{{server}}/apis/posttrain.dev/v1alpha1/namespaces/{{namespace}}/provenancerecords"
request = urllib.request.Request(url, json.dumps(record).encode(), {{"Content-Type": "application/json"}})
try:
    urllib.request.urlopen(request, context=ssl._create_unverified_context(), timeout=10)
    found["append"] = "created"
except Exception as exc:
    found["append"] = f"refused: {{type(exc).__name__}}: {{exc}}"
with open(os.path.join(os.environ["POSTTRAIN_OUTPUT_DIR"], "forger.json"), "w") as f:
    json.dump(found, f)
print(json.dumps(found))
"""


async def tool(orch: Orchestrator, name: str, **arguments: Any) -> dict[str, Any]:
    reply = await orch.call(name, **arguments)
    observation = reply["observation"]
    assert observation["error"] is None, (name, observation["error"], observation["metadata"])
    result: dict[str, Any] = observation["result"]["structured_content"]
    return result


async def wait_job(orch: Orchestrator, job: str) -> dict[str, Any]:
    waited: dict[str, Any] = {"finished": False}
    while not waited["finished"]:
        waited = await tool(orch, "jobs_wait", job=job, timeout_seconds=20)
    return waited


def audit_entries(cluster: devcluster.ClusterState, offset: int, users: set[str]) -> Iterator[dict[str, Any]]:
    with Path(cluster.audit_log).open("rb") as f:
        f.seek(offset)
        for line in f:
            entry = json.loads(line)
            if entry.get("user", {}).get("username") in users:
                yield entry


def action(entry: dict[str, Any]) -> str:
    ref = entry.get("objectRef", {})
    resource = ref.get("resource", entry.get("requestURI", "?"))
    if ref.get("subresource"):
        resource += "/" + ref["subresource"]
    return f"{entry['verb']} {resource}"


async def test_full_episode_with_the_charts_identities_meets_no_403(
    cluster: devcluster.ClusterState,
    kubectl: Kubectl,
    release: Release,
    chart_operator: ChartOperator,
    chart_gateway: GatewayServer,
) -> None:
    ns = release.namespace
    # kopf's liveness endpoint, as the chart's probe asks it.
    async with httpx.AsyncClient(timeout=10) as http:
        assert (await http.get(f"http://127.0.0.1:{chart_operator.health_port}/healthz")).status_code == 200

    # An Episode made with kubectl (no agentTokenHash): the operator keeps its token in a Secret.
    apply(kubectl, ns, episode_manifest("by-kubectl", budget="0.01"))
    started = wait_phase(kubectl, ns, "episode", "by-kubectl", {"Running"})
    assert started["status"]["agentTokenSecret"] == "by-kubectl-agent-token"
    kubectl("-n", ns, "delete", "episode", "by-kubectl", "--wait=true", "--timeout=60s")

    # The whole episode through the gateway: reset, train, logs (the broker), devEval, a cancelled
    # job, submit, the reward.
    async with orchestrator(chart_gateway) as orch:
        reset = await orch.reset(task="t0_artifact", budget_usd="0.05")
        episode = reset["observation"]["episode"]
        submitted = await tool(orch, "jobs_submit", script=ARTIFACT_SCRIPT, timeout_seconds=300)
        job = submitted["job"]["name"]
        assert (await wait_job(orch, job))["job"]["phase"] == "Succeeded"
        # The broker may answer 500 once for a just-finished emulator job (see test_gateway_mcp_sdk).
        for _ in range(3):
            reply = await orch.call("jobs_logs", job=job, tail=50)
            if reply["observation"]["error"] is None:
                break
        logs = await tool(orch, "jobs_logs", job=job, tail=50)
        assert any("wrote" in line for line in logs["lines"]), logs

        dev = await tool(orch, "dev_evaluate", job=job)
        assert (await wait_job(orch, dev["job"]["name"]))["job"]["result"]["score"] == "1"

        sleeper = (await tool(orch, "jobs_submit", script=SLEEPER, timeout_seconds=300))["job"]["name"]
        await tool(orch, "jobs_cancel", job=sleeper)

        forger_script = FORGER.format(server=cluster.server, namespace=ns, episode=episode)
        forger = (await tool(orch, "jobs_submit", script=forger_script, timeout_seconds=300))["job"]["name"]
        assert (await wait_job(orch, forger))["job"]["phase"] == "Succeeded"
        attempt = json.loads((await tool(orch, "jobs_read_artifact", job=forger, path="forger.json"))["text"])
        assert attempt["append"].startswith("refused"), attempt
        assert attempt["service_account_files"] == [], attempt

        await tool(orch, "submit", job=job)
        final: dict[str, Any] = {"finished": False}
        while not final["finished"]:
            reply = await orch.call("jobs_wait", timeout_seconds=20)
            final = reply["observation"]["result"]["structured_content"]
        assert final["outcome"] == "Scored" and final["reward"] == "1", final
        assert reply["done"] is True and reply["reward"] == 1.0
    assert get(kubectl, ns, "episode", episode)["status"]["ledger"]["reservedMicroUSD"] == 0
    check_provenance(kubectl, ns, episode, chart_operator.emulator, cancelled=sleeper)

    users = {release.operator_user, release.gateway_user}
    entries = list(audit_entries(cluster, release.audit_offset, users))
    denied = [e for e in entries if e.get("responseStatus", {}).get("code") == 403]
    assert denied == [], [(e["user"]["username"], action(e), e.get("requestURI")) for e in denied]
    # The processes really used the chart's identities, for every kind of access they need.
    used = {(e["user"]["username"], action(e)) for e in entries}
    for user, needed in [
        (release.operator_user, [
            "watch episodes", "watch agentjobs", "watch customresourcedefinitions", "list namespaces",
            "patch episodes", "patch agentjobs", "update episodes/status", "patch agentjobs/status",
            "create agentjobs", "create secrets", "create events", "create tokenreviews",
            "create provenancerecords", "list provenancerecords",
        ]),
        (release.gateway_user, [
            "create episodes", "get episodes", "watch episodes", "patch episodes", "patch episodes/status",
            "create agentjobs", "watch agentjobs", "delete agentjobs", "create provenancerecords",
        ]),
    ]:  # fmt: skip
        missing = [a for a in needed if (user, a) not in used]
        assert missing == [], (user, missing, sorted(a for u, a in used if u == user))


def check_provenance(kubectl: Kubectl, ns: str, episode: str, emulator: HfEmulator, cancelled: str) -> None:
    """The Episode's provenance accounts for every tool call the gateway counted and every job the
    backend ran (`cancelled` too, whose AgentJob jobs_cancel deleted), the summary in its status says
    so, and no record can be changed, even by an admin."""
    ended = wait_for(
        lambda: (e := get(kubectl, ns, "episode", episode))["status"].get("provenance") and e,
        timeout=180, what="the ended Episode's provenance summary",
    )  # fmt: skip
    status = ended["status"]
    records = json.loads(kubectl("-n", ns, "get", "provenancerecords", "-o", "json").stdout)["items"]
    specs = provenance.specs_of(r for r in records if r["spec"]["episode"] == episode)
    summary = provenance.summarise(specs)
    assert summary.model_dump() == ProvenanceSummary.model_validate(status["provenance"]).model_dump()
    assert summary.chain == "intact"
    calls = [call for spec in specs for call in spec.tool_calls]
    assert len(calls) == status["steps"] > 0
    tools = [call.tool for call in calls]
    assert tools.count("jobs_submit") == 3 and tools.count("submit") == 1, tools
    jobs = {spec.job.job: spec.job for spec in specs if spec.job is not None}
    listed = json.loads(kubectl("-n", ns, "get", "agentjobs", "-o", "json").stdout)["items"]
    listed = [j for j in listed if j["spec"]["episode"] == episode]
    assert sorted(jobs) == sorted([cancelled, *(j["metadata"]["name"] for j in listed)])
    assert jobs[cancelled].phase == "Cancelled" and jobs[cancelled].backend_job_id
    label = label_value(f"{ns}-{episode}")
    ran = {j["id"] for j in emulator.jobs() if (j.get("labels") or {}).get("posttrain-episode") == label}
    assert {j.backend_job_id for j in jobs.values() if j.backend_job_id} == ran
    for listed_job in listed:
        job = jobs[listed_job["metadata"]["name"]]
        assert job.phase == listed_job["status"]["phase"]
        assert job.billed_seconds == listed_job["status"].get("billedSeconds")
    (submission,) = [spec.submission for spec in specs if spec.submission is not None]
    assert submission.checkpoint_from == next(c.job for c in calls if c.tool == "jobs_submit")
    # Append-only: the schema refuses a change to any record, whoever asks.
    name = provenance.calls_record_name(episode, 0)
    patch = json.dumps({"spec": {"toolCalls": [], "sequence": 0}})
    refused = kubectl("-n", ns, "patch", "provenancerecord", name, "--type=merge", "-p", patch, check=False)
    assert refused.returncode != 0 and "append-only" in refused.stderr, refused.stderr


# (identity, verb, resource, namespace or None for cluster-wide): each must be denied.
def denied_actions(release: Release) -> list[tuple[str, str, str, str | None]]:
    ns, op, gw = release.namespace, release.operator_user, release.gateway_user
    return [
        (gw, "get", "secrets", ns),
        (gw, "list", "secrets", ns),
        (gw, "watch", "secrets", ns),
        (gw, "get", "secrets/hf-token", ns),
        (gw, "list", "secrets", None),
        (gw, "create", "secrets", ns),
        (gw, "patch", "agentjobs.posttrain.dev/status", ns),
        (gw, "update", "agentjobs.posttrain.dev/status", ns),
        (gw, "update", "episodes.posttrain.dev", ns),
        (gw, "update", "episodes.posttrain.dev/status", ns),
        (gw, "update", "episodes.posttrain.dev/finalizers", ns),
        (gw, "create", "episodes.posttrain.dev", "default"),
        (gw, "list", "episodes.posttrain.dev", None),
        (gw, "create", "pods", ns),
        (gw, "create", "tokenreviews.authentication.k8s.io", None),
        (gw, "update", "provenancerecords.posttrain.dev", ns),
        (gw, "patch", "provenancerecords.posttrain.dev", ns),
        (gw, "delete", "provenancerecords.posttrain.dev", ns),
        (op, "list", "secrets", ns),
        (op, "watch", "secrets", ns),
        (op, "delete", "secrets", ns),
        (op, "update", "secrets", ns),
        (op, "get", "secrets", "default"),
        (op, "create", "pods", ns),
        (op, "list", "pods", None),
        (op, "create", "namespaces", None),
        (op, "create", "networkpolicies.networking.k8s.io", ns),
        (op, "delete", "episodes.posttrain.dev", ns),
        (op, "delete", "agentjobs.posttrain.dev", ns),
        (op, "patch", "episodes.posttrain.dev/status", ns),
        (op, "update", "agentjobs.posttrain.dev/status", ns),
        (op, "get", "episodes.posttrain.dev", "default"),
        (op, "create", "clusterroles.rbac.authorization.k8s.io", None),
        (op, "impersonate", "serviceaccounts", ns),
        (op, "update", "provenancerecords.posttrain.dev", ns),
        (op, "delete", "provenancerecords.posttrain.dev", ns),
    ]


def can_i(kubectl: Kubectl, user: str, verb: str, resource: str, namespace: str | None) -> bool:
    """`resource` is `kind[.group]`, `kind[.group]/<status|finalizers>` (a subresource) or
    `kind/<name>` (one object)."""
    scope = ["-n", namespace] if namespace else ["--all-namespaces"]
    kind, _, sub = resource.partition("/")
    args = [kind, f"--subresource={sub}"] if sub in {"status", "finalizers"} else [resource]
    proc = kubectl("auth", "can-i", verb, *args, f"--as={user}", *scope, check=False)
    answer = proc.stdout.strip()
    assert answer in {"yes", "no"}, proc.stderr
    return answer == "yes"


def test_listed_actions_are_denied_and_needed_ones_allowed(kubectl: Kubectl, release: Release) -> None:
    allowed = [
        (release.gateway_user, "create", "episodes.posttrain.dev", release.namespace),
        (release.gateway_user, "patch", "episodes.posttrain.dev/status", release.namespace),
        (release.operator_user, "create", "secrets", release.namespace),
        (release.operator_user, "update", "episodes.posttrain.dev/status", release.namespace),
        (release.operator_user, "patch", "agentjobs.posttrain.dev/status", release.namespace),
        (release.operator_user, "create", "tokenreviews.authentication.k8s.io", None),
        (release.operator_user, "create", "subjectaccessreviews.authorization.k8s.io", None),
    ]
    assert [a for a in allowed if not can_i(kubectl, *a)] == []
    assert [a for a in denied_actions(release) if can_i(kubectl, *a)] == []


def test_only_the_operator_may_create_score_jobs(
    kubectl: Kubectl, release: Release, as_operator: Kubectl, as_gateway: Kubectl
) -> None:
    score = agentjob_manifest("ep-score", "ep", purpose="score", script="", checkpointFrom="answer")
    train = agentjob_manifest("ep-train", "ep")

    def create(who: Kubectl, body: dict[str, Any]) -> Any:
        return who(
            "-n", release.namespace, "create", "--dry-run=server", "-o", "name", "-f", "-",
            check=False, input=json.dumps(body),
        )  # fmt: skip

    # Admission policies take effect a moment after they are created (the apiserver's informer).
    refused = wait_for(lambda: (r := create(as_gateway, score)).returncode != 0 and r, timeout=30,
                       what="the admission policy to refuse the gateway's score job")  # fmt: skip
    assert "only the posttrain operator creates AgentJobs with spec.purpose 'score'" in refused.stderr
    assert "ValidatingAdmissionPolicy" in refused.stderr
    # Cluster admins too: nobody but the operator.
    refused = create(kubectl, score)
    assert "only the posttrain operator creates" in refused.stderr, refused.stderr
    # The gateway's train jobs and the operator's score jobs pass.
    assert create(as_gateway, train).stdout.strip() == "agentjob.posttrain.dev/ep-train"
    allowed = create(as_operator, score)
    assert allowed.returncode == 0, allowed.stderr
    assert allowed.stdout.strip() == "agentjob.posttrain.dev/ep-score"


def test_each_provenance_writer_may_create_only_its_own_records(
    kubectl: Kubectl, release: Release, as_operator: Kubectl, as_gateway: Kubectl
) -> None:
    calls = provenance.ProvenanceSpec(
        format=provenance.FORMAT, episode="ep", writer="gateway",
        tool_calls=[tool_call("task_info", {}, "ok", 0, "2026-12-05T00:00:00Z", None)],
    )  # fmt: skip
    submission = provenance.ProvenanceSpec(
        format=provenance.FORMAT, episode="ep", writer="operator",
        submission=provenance.SubmissionEntry(checkpoint_from="j1", at="2026-12-05T00:00:00Z"),
    )  # fmt: skip
    gateway_record = provenance.record(provenance.calls_record_name("ep", 0), calls, None)
    operator_record = provenance.record(provenance.submission_record_name("ep"), submission, None)

    def create(who: Kubectl, body: dict[str, Any]) -> Any:
        return who(
            "-n", release.namespace, "create", "--dry-run=server", "-o", "name", "-f", "-",
            check=False, input=json.dumps(body),
        )  # fmt: skip

    message = "a ProvenanceRecord is created by its writer only"
    # Admission policies take effect a moment after they are created (the apiserver's informer).
    refused = wait_for(lambda: (r := create(as_gateway, operator_record)).returncode != 0 and r, timeout=30,
                       what="the admission policy to refuse the gateway's operator record")  # fmt: skip
    assert message in refused.stderr, refused.stderr
    for who, body in [(as_operator, gateway_record), (kubectl, gateway_record), (kubectl, operator_record)]:
        refused = create(who, body)
        assert refused.returncode != 0 and message in refused.stderr, refused.stderr
    for who, body in [(as_gateway, gateway_record), (as_operator, operator_record)]:
        allowed = create(who, body)
        assert allowed.returncode == 0, allowed.stderr
        assert allowed.stdout.strip() == f"provenancerecord.posttrain.dev/{body['metadata']['name']}"
