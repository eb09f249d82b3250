"""Status conditions are a list map keyed by type with RFC 3339 transition times, enforced by the API
server: a server-side apply of one condition leaves another manager's alone, a duplicate type or a
malformed time is refused."""

from __future__ import annotations

import json
from typing import Any

from tests.helpers import Kubectl, kubectl_json
from tests.integration.support import episode_manifest


def _condition(type_: str, status: str = "True", when: str = "2026-01-02T03:04:05Z") -> dict[str, Any]:
    return {"type": type_, "status": status, "reason": "Because", "lastTransitionTime": when}


def _apply_status(kubectl: Kubectl, namespace: str, manager: str, conditions: list[dict[str, Any]]) -> Any:
    body = {
        "apiVersion": "posttrain.dev/v1alpha1",
        "kind": "Episode",
        "metadata": {"name": "ep"},
        "status": {"conditions": conditions},
    }
    return kubectl(
        "-n", namespace, "apply", "--server-side", "--subresource=status", f"--field-manager={manager}",
        "-f", "-", input=json.dumps(body), check=False,
    )  # fmt: skip


def _conditions(kubectl: Kubectl, namespace: str) -> dict[str, str]:
    episode = kubectl_json(kubectl, "-n", namespace, "get", "episode", "ep")
    return {c["type"]: c["status"] for c in episode.get("status", {}).get("conditions", [])}


def test_each_manager_owns_its_own_conditions(kubectl: Kubectl, namespace: str, crds: None) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(episode_manifest("ep")))
    assert _apply_status(kubectl, namespace, "operator", [_condition("Ready")]).returncode == 0
    # Another manager's condition merges in by its type (an atomic list would need to take over Ready).
    assert _apply_status(kubectl, namespace, "judge", [_condition("Audited", "False")]).returncode == 0
    assert _conditions(kubectl, namespace) == {"Ready": "True", "Audited": "False"}
    # The operator flips its own condition; the judge's stays.
    assert _apply_status(kubectl, namespace, "operator", [_condition("Ready", "False")]).returncode == 0
    assert _conditions(kubectl, namespace) == {"Ready": "False", "Audited": "False"}


def test_a_duplicate_type_or_a_malformed_time_is_refused(
    kubectl: Kubectl, namespace: str, crds: None
) -> None:
    kubectl("-n", namespace, "create", "-f", "-", input=json.dumps(episode_manifest("ep")))
    twice = [_condition("Ready"), _condition("Ready", "False")]
    applied = _apply_status(kubectl, namespace, "operator", twice)
    assert applied.returncode != 0 and 'duplicate entries for key [type="Ready"]' in applied.stderr
    # A merge patch (how the operator writes) is refused by validation.
    patched = kubectl("-n", namespace, "patch", "episode", "ep", "--subresource=status", "--type=merge",
                      "-p", json.dumps({"status": {"conditions": twice}}), check=False)  # fmt: skip
    assert patched.returncode != 0 and "Duplicate value" in patched.stderr, patched.stderr
    late = _apply_status(kubectl, namespace, "operator", [_condition("Ready", when="yesterday")])
    assert late.returncode != 0 and "lastTransitionTime" in late.stderr, late.stderr
    assert _conditions(kubectl, namespace) == {}
