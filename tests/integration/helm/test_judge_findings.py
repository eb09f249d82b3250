"""The judge hook with the chart's RBAC and the chart's operator identity: a judge bound to the chart's
judge ClusterRole appends a finding to an ended Episode; the gateway's identity and an unbound one
may not create one at all, nor may a judge say it was applied; a finding on an Episode that has not
ended, or on none, is refused; a malformed one is refused by the API server; none of these changes
the Episode."""

from __future__ import annotations

import json
import subprocess
from typing import Any

from tests.helpers import Kubectl
from tests.integration.helm.support import ChartOperator, Release
from tests.integration.support import apply, episode_manifest, get, wait_phase


def _finding(name: str, episode: str, **spec: Any) -> str:
    body = {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "JudgeFinding",
        "metadata": {"name": name},
        "spec": {
            "episode": episode,
            "verdict": "violation",
            "summary": "the script embeds test items",
            **spec,
        },
    }
    return json.dumps(body)


def _integrity(kubectl: Kubectl, release: Release, episode: str) -> Any:
    return get(kubectl, release.namespace, "episode", episode)["status"].get("integrity")


def test_a_judge_appends_a_finding_to_an_ended_episode_and_no_one_else_may(
    kubectl: Kubectl, release: Release, chart_operator: ChartOperator, as_gateway: Kubectl
) -> None:
    ns = release.namespace
    judge = f"system:serviceaccount:{ns}:llm-judge"
    kubectl("-n", ns, "create", "serviceaccount", "llm-judge")
    kubectl("-n", ns, "create", "rolebinding", "llm-judge",
            f"--clusterrole={release.fullname}-judge", f"--serviceaccount={ns}:llm-judge")  # fmt: skip

    def create(body: str, *who: str, by: Kubectl = kubectl) -> subprocess.CompletedProcess[str]:
        return by("-n", ns, "create", "-f", "-", *who, check=False, input=body)

    apply(kubectl, ns, episode_manifest("running", budget="0.01"))
    apply(kubectl, ns, episode_manifest("ended", budget="0.01", limits={"maxWallSeconds": 1}))
    wait_phase(kubectl, ns, "episode", "running", {"Running"})
    ended = wait_phase(kubectl, ns, "episode", "ended", {"Completed"})["status"]
    assert ended["outcome"] == "LimitReached" and "integrity" not in ended

    # Not a judge: the gateway (which may patch Episodes) and an identity with no binding.
    for refused in (
        create(_finding("by-gateway", "ended"), by=as_gateway),
        create(_finding("by-nobody", "ended"), f"--as=system:serviceaccount:{ns}:nobody"),
    ):
        assert refused.returncode != 0 and "forbidden" in refused.stderr.lower(), refused.stderr

    # Malformed: refused by the schema, whoever sends it.
    for spec in ({"verdict": "clean"}, {"summary": ""}, {"where": ["x"] * 9}, {"check": "identity"}):
        malformed = create(_finding("malformed", "ended", **spec), f"--as={judge}")
        assert malformed.returncode != 0 and "JudgeFinding" in malformed.stderr, (spec, malformed.stderr)
    names = kubectl("-n", ns, "get", "judgefindings", "-o", "name").stdout.split()
    assert names == [] and _integrity(kubectl, release, "ended") is None

    # A finding on a running Episode, and on none: refused by the operator, nothing appended.
    create(_finding("too-early", "running"), f"--as={judge}").check_returncode()
    create(_finding("nowhere", "no-such-episode"), f"--as={judge}").check_returncode()
    early = wait_phase(kubectl, ns, "judgefinding", "too-early", {"Applied", "Refused"})["status"]
    assert (early["phase"], early["reason"]) == ("Refused", "EpisodeNotEnded"), early
    nowhere = wait_phase(kubectl, ns, "judgefinding", "nowhere", {"Applied", "Refused"})["status"]
    assert (nowhere["phase"], nowhere["reason"]) == ("Refused", "EpisodeNotFound"), nowhere
    assert _integrity(kubectl, release, "running") is None

    # The judge's finding on the ended Episode: appended, the label set; the outcome and reward kept.
    where = {"where": ["script:train-1"], "figures": {"items": "12"}}
    create(_finding("verdict-1", "ended", **where), f"--as={judge}").check_returncode()
    applied = wait_phase(kubectl, ns, "judgefinding", "verdict-1", {"Applied", "Refused"})["status"]
    assert applied["phase"] == "Applied", applied
    after = get(kubectl, ns, "episode", "ended")["status"]
    assert after["integrity"]["label"] == "violation"
    (finding,) = after["integrity"]["findings"]
    assert (finding["check"], finding["source"], finding["where"]) == (
        "judge",
        "verdict-1",
        ["script:train-1"],
    )
    assert (after["outcome"], after["reward"]) == (ended["outcome"], ended["reward"])

    # A judge cannot say a finding was applied (the status is the operator's), nor rewrite one.
    forged = kubectl("-n", ns, "patch", "judgefinding", "too-early", "--subresource=status", "--type=merge",
                     "-p", '{"status": {"phase": "Applied"}}', f"--as={judge}", check=False)  # fmt: skip
    assert forged.returncode != 0 and "forbidden" in forged.stderr.lower(), forged.stderr
    edited = kubectl("-n", ns, "patch", "judgefinding", "verdict-1", "--type=merge",
                     "-p", '{"spec": {"verdict": "flagged"}}', check=False)  # fmt: skip
    assert edited.returncode != 0 and "immutable" in edited.stderr, edited.stderr
