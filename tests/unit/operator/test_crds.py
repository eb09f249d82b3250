"""The CRDs in crds/ are exactly what the models generate, and their schemas are strict."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from posttrain_operator.api import crds
from posttrain_operator.api.models import MAX_SCRIPT_BYTES, AgentJobSpec
from pydantic import ValidationError

CRD_DIR = Path(__file__).resolve().parents[3] / "crds"


def test_committed_crds_match_the_models() -> None:
    assert crds.main(["--check", str(CRD_DIR)]) == 0


def test_drift_is_detected(tmp_path: Path) -> None:
    crds.main(["--write", str(tmp_path)])
    target = next(tmp_path.glob("*episodes.yaml"))
    target.write_text(target.read_text().replace("budgetUSD is the dollar budget", "budget"))
    assert crds.main(["--check", str(tmp_path)]) == 1


def _walk(node: object, path: str = "") -> list[str]:
    found = []
    if isinstance(node, dict):
        if node.get("x-kubernetes-preserve-unknown-fields"):
            found.append(path)
        for key, value in node.items():
            found += _walk(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += _walk(value, f"{path}[{i}]")
    return found


def test_no_spec_keeps_unknown_fields() -> None:
    for crd in crds.render().values():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert _walk(schema["properties"]["spec"]) == []
        assert schema["properties"]["spec"]["x-kubernetes-validations"]


def _undescribed(node: dict[str, Any], path: str) -> list[str]:
    missing = []
    for key, child in (node.get("properties") or {}).items():
        if not child.get("description"):
            missing.append(f"{path}.{key}")
        missing += _undescribed(child, f"{path}.{key}")
    if isinstance(node.get("items"), dict):
        missing += _undescribed(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        missing += _undescribed(node["additionalProperties"], f"{path}{{}}")
    return missing


def test_every_spec_and_status_field_is_described_for_kubectl_explain() -> None:
    for name, crd in crds.render().items():
        schema = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        for part in ("spec", "status") if "status" in schema["properties"] else ("spec",):
            assert _undescribed(schema["properties"][part], part) == [], name


def test_the_operator_counts_the_script_limit_in_bytes() -> None:
    base = {"episode": "ep", "purpose": "train", "flavor": "cpu-basic", "timeoutSeconds": 600}
    assert AgentJobSpec.model_validate({**base, "script": "é" * (MAX_SCRIPT_BYTES // 2)})
    with pytest.raises(ValidationError, match=f"larger than {MAX_SCRIPT_BYTES} bytes"):
        AgentJobSpec.model_validate({**base, "script": "é" * MAX_SCRIPT_BYTES})
    schema = crds.render()["posttrain.dev_agentjobs.yaml"]["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    rules = schema["properties"]["spec"]["x-kubernetes-validations"]
    assert any("size(bytes(self.script))" in r["rule"] for r in rules)
