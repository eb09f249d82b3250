"""The `posttrain` command against the devstack's real API server, a real operator and the HF emulator:
list, describe and reports of real episodes (reports read back as pictures), watch until an episode
ends, `logs` allowed or refused by RBAC for ServiceAccount identities, and `token`."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from posttrain_operator.api.rules import token_hash

from devstack.controlplane import cluster as devcluster
from posttrain_cli.report import PHASE_COLORS, SPEND_COLOR
from tests.helpers import Kubectl, wait_for
from tests.integration.support import (
    OperatorProcess,
    agentjob_manifest,
    apply,
    episode_manifest,
    get,
    wait_phase,
)
from tests.unit.cli.report_pixels import inlined_png, pixels_of

POSTTRAIN = Path(sys.executable).parent / "posttrain"  # the console script, as a user runs it
READY_SECONDS = 300  # the operator's start-up (imports, first watches) on a loaded machine


def posttrain(
    kubeconfig: Path | str, namespace: str, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(POSTTRAIN), "--kubeconfig", str(kubeconfig), "--namespace", namespace, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def _episode_with_jobs(kubectl: Kubectl, namespace: str) -> None:
    """ep: one job that ran and settled one minute, one refused for the budget (as in test_metrics)."""
    apply(kubectl, namespace, episode_manifest("ep", budget="0.0018"))
    wait_phase(kubectl, namespace, "episode", "ep", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("ran", "ep", timeoutSeconds=600))
    wait_phase(kubectl, namespace, "agentjob", "ran", {"Succeeded"})
    apply(kubectl, namespace, agentjob_manifest("too-big", "ep", timeoutSeconds=600))
    wait_phase(kubectl, namespace, "agentjob", "too-big", {"Rejected"})
    wait_for(lambda: get(kubectl, namespace, "episode", "ep")["status"]["ledger"]["settledMicroUSD"],
             what="the ledger to settle")  # fmt: skip


def _service_account(kubectl: Kubectl, cluster: devcluster.ClusterState, namespace: str, name: str,
                     tmp_path: Path, *, reads_jobs: bool) -> Path:  # fmt: skip
    kubectl("-n", namespace, "create", "serviceaccount", name)
    if reads_jobs:
        kubectl(
            "-n",
            namespace,
            "create",
            "role",
            f"{name}-jobs",
            "--verb=get,list",
            "--resource=agentjobs.posttrain.dev",
        )
        kubectl("-n", namespace, "create", "rolebinding", f"{name}-jobs", f"--role={name}-jobs",
                f"--serviceaccount={namespace}:{name}")  # fmt: skip
    return devcluster.mint_service_account_kubeconfig(
        cluster, namespace, name, tmp_path / f"{name}.kubeconfig"
    )


def test_list_describe_and_reports_of_a_real_episode(
    kubectl: Kubectl,
    cluster: devcluster.ClusterState,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    operator.wait_ready(timeout=READY_SECONDS)
    _episode_with_jobs(kubectl, namespace)
    kubeconfig = cluster.kubeconfig

    listed = posttrain(kubeconfig, namespace, "list")
    assert listed.returncode == 0, listed.stderr
    header, row = listed.stdout.splitlines()[:2]
    assert header.split()[:5] == ["NAME", "PHASE", "OUTCOME", "TASK", "STEPS"]
    assert row.split()[:6] == ["ep", "Running", "-", "t0_artifact", "0", "$0.000167"]

    described = posttrain(kubeconfig, namespace, "describe", "ep")
    assert described.returncode == 0, described.stderr
    rows = {line.split()[0]: line.split() for line in described.stdout.split("Ledger:")[1].splitlines()[2:]}
    assert rows["ran"][1:7] == ["train", "Succeeded", "$0.00167", "$0.000167", rows["ran"][5], "agent"]
    assert rows["too-big"][1:4] == ["train", "Rejected", "-"] and "BudgetExceeded" in rows["too-big"]

    html, png = tmp_path / "ep.html", tmp_path / "ep.png"
    reported = posttrain(kubeconfig, namespace, "report", "ep", "--output", str(html), "--png", str(png))
    assert reported.returncode == 0, reported.stderr
    page = html.read_text()
    assert inlined_png(page) == png.read_bytes()
    picture = png.read_bytes()
    assert pixels_of(picture, PHASE_COLORS["Succeeded"]) > 100  # the job that ran
    assert pixels_of(picture, PHASE_COLORS["Rejected"]) > 20  # the refused one, a sliver
    assert pixels_of(picture, SPEND_COLOR) > 100  # the spend line
    assert "BudgetExceeded" in page and "$0.000167" in page

    summary = tmp_path / "ns.html"
    assert posttrain(kubeconfig, namespace, "report", "--output", str(summary)).returncode == 0
    assert "<td>ep</td>" in summary.read_text()

    missing = posttrain(kubeconfig, namespace, "describe", "nope")
    assert missing.returncode == 1 and "not found" in missing.stderr


def test_watch_follows_an_episode_until_it_ends(
    kubectl: Kubectl, cluster: devcluster.ClusterState, namespace: str, operator: OperatorProcess
) -> None:
    operator.wait_ready(timeout=READY_SECONDS)
    apply(kubectl, namespace, episode_manifest("ep", budget="0.50", limits={"maxSteps": 2}))
    wait_phase(kubectl, namespace, "episode", "ep", {"Running"})
    watcher = subprocess.Popen(
        [str(POSTTRAIN), "--kubeconfig", str(cluster.kubeconfig), "-n", namespace, "watch", "--until-done"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert watcher.stdout is not None
        seen = [watcher.stdout.readline(), watcher.stdout.readline()]  # the header, then the episode
        assert seen[1].split()[:2] == ["ep", "Running"], seen
        # What the gateway does on each tool call; at the limit the operator ends the episode.
        for steps in (1, 2):
            kubectl("-n", namespace, "patch", "episode", "ep", "--subresource=status", "--type=merge",
                    "-p", f'{{"status":{{"steps":{steps}}}}}')  # fmt: skip
        out, err = watcher.communicate(timeout=120)
    finally:
        watcher.kill()
    assert watcher.returncode == 0, err
    rows = [line.split() for line in [*seen, *out.splitlines()] if line.startswith("ep ")]
    assert rows[0][1] == "Running" and rows[-1][1:3] == ["Completed", "LimitReached"], rows
    assert [r[4] for r in rows] == sorted(r[4] for r in rows) and rows[-1][4] == "2"  # steps, as they grew


def test_logs_are_read_as_the_caller_and_refused_without_rbac(
    kubectl: Kubectl,
    cluster: devcluster.ClusterState,
    namespace: str,
    executing_operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    executing_operator.wait_ready(timeout=READY_SECONDS)
    apply(kubectl, namespace, episode_manifest("ep", budget="0.50"))
    wait_phase(kubectl, namespace, "episode", "ep", {"Running"})
    apply(kubectl, namespace, agentjob_manifest("talker", "ep", script="print('hello from the job')"))
    wait_phase(kubectl, namespace, "agentjob", "talker", {"Succeeded"}, timeout=300)
    reader = _service_account(kubectl, cluster, namespace, "reader", tmp_path, reads_jobs=True)
    stranger = _service_account(kubectl, cluster, namespace, "stranger", tmp_path, reads_jobs=False)
    broker = ("--broker-url", executing_operator.broker_url)

    allowed = posttrain(reader, namespace, "logs", "talker", *broker)
    assert allowed.returncode == 0, allowed.stderr
    assert "hello from the job" in allowed.stdout

    refused = posttrain(stranger, namespace, "logs", "talker", *broker)
    assert refused.returncode == 1
    assert "403" in refused.stderr and f"system:serviceaccount:{namespace}:stranger" in refused.stderr
    assert "hello" not in refused.stdout

    nowhere = posttrain(reader, namespace, "logs", "talker")
    assert nowhere.returncode == 1 and "--broker-url" in nowhere.stderr


def _grant(kubectl: Kubectl, namespace: str, name: str, rules: dict[str, list[str]]) -> None:
    """A Role of posttrain.dev rules ({resource: verbs}) bound to ServiceAccount `name`."""
    role = {
        "apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role", "metadata": {"name": name},
        "rules": [{"apiGroups": ["posttrain.dev"], "resources": [r], "verbs": v} for r, v in rules.items()],
    }  # fmt: skip
    apply(kubectl, namespace, role)
    kubectl("-n", namespace, "create", "rolebinding", name, f"--role={name}",
            f"--serviceaccount={namespace}:{name}")  # fmt: skip


def test_token_replaces_the_agent_token_only_for_who_may_patch_the_episode_s_status(
    kubectl: Kubectl,
    cluster: devcluster.ClusterState,
    namespace: str,
    operator: OperatorProcess,
    tmp_path: Path,
) -> None:
    operator.wait_ready(timeout=READY_SECONDS)
    apply(kubectl, namespace, episode_manifest("ep", budget="0.50"))
    before = wait_phase(kubectl, namespace, "episode", "ep", {"Running"})["status"]["agentTokenHash"]
    stranger = _service_account(kubectl, cluster, namespace, "stranger", tmp_path, reads_jobs=True)
    # May update the Episode itself but not its status: the token is refused before anything is written.
    editor = _service_account(kubectl, cluster, namespace, "editor", tmp_path, reads_jobs=False)
    _grant(kubectl, namespace, "editor", {"episodes": ["get", "update", "patch"]})
    # May read the Episode and patch its status, nothing else: all `token` does.
    rotator = _service_account(kubectl, cluster, namespace, "rotator", tmp_path, reads_jobs=False)
    _grant(kubectl, namespace, "rotator", {"episodes": ["get"], "episodes/status": ["patch"]})

    for who in (stranger, editor):
        refused = posttrain(who, namespace, "token", "ep")
        assert refused.returncode == 1 and "may not get episodes and patch episodes/status" in refused.stderr
        assert get(kubectl, namespace, "episode", "ep")["status"]["agentTokenHash"] == before

    for who in (rotator, cluster.kubeconfig):
        minted = posttrain(who, namespace, "token", "ep")
        assert minted.returncode == 0, minted.stderr
        token = minted.stdout.strip()
        assert len(token) >= 40
        after = get(kubectl, namespace, "episode", "ep")["status"]["agentTokenHash"]
        assert after == token_hash(token) != before
        before = after


def test_quota_shows_the_namespace_s_limit_spend_and_periods(
    kubectl: Kubectl, cluster: devcluster.ClusterState, namespace: str, operator: OperatorProcess
) -> None:
    none = posttrain(cluster.kubeconfig, namespace, "quota")
    assert none.returncode == 0, none.stderr
    assert none.stdout.strip() == (
        f"No BudgetQuota in namespace {namespace}: each Episode is limited by its own budget only."
    )
    quota = {"apiVersion": "posttrain.dev/v1alpha1", "kind": "BudgetQuota", "metadata": {"name": "default"},
             "spec": {"limitUSD": "0.01", "flavors": ["cpu-basic"], "maxEpisodeBudgetUSD": "1"}}  # fmt: skip
    apply(kubectl, namespace, quota)
    operator.wait_ready(timeout=READY_SECONDS)
    _episode_with_jobs(kubectl, namespace)  # one job settled at $0.000167, one refused by its Episode

    def settled() -> int:
        return int(
            get(kubectl, namespace, "budgetquota", "default").get("status", {}).get("settledMicroUSD", 0)
        )

    wait_for(settled, what="the quota to record the settled job")

    shown = posttrain(cluster.kubeconfig, namespace, "quota")
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[1].split() == ["Limit:", "$0.01", "per", "CalendarMonth"]
    assert lines[3].split()[:6] == ["Settled:", "$0.000167", "Reserved:", "$0.00", "Remaining:", "$0.009833"]
    assert "Flavors:     cpu-basic" in lines and "Episode cap: $1" in lines
    assert any(line.startswith("Ready:") and "Applied" in line for line in lines)
    month = get(kubectl, namespace, "budgetquota", "default")["status"]["window"]
    period = next(line.split() for line in lines if line.startswith(month))
    assert period == [month, "1", "$0.000167", "$0.00", "$0.00"]  # the refused job's reservation released
