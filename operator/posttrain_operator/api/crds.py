"""Generate the CRDs (Episode, AgentJob, JudgeFinding, ProvenanceRecord, BudgetQuota) from the models.

`python -m posttrain_operator.api.crds --write DIR` writes them; `--check DIR` fails on drift. The
schemas are structural and strict (no preserve-unknown-fields on spec); immutability is CEL.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from posttrain_operator.api.episode import EpisodeSpec, EpisodeStatus
from posttrain_operator.api.judging import JudgeFindingSpec, JudgeFindingStatus
from posttrain_operator.api.models import GROUP, MAX_SCRIPT_BYTES, VERSION, AgentJobSpec, AgentJobStatus
from posttrain_operator.api.provenance import ProvenanceSpec
from posttrain_operator.api.quota import QUOTA_NAME, BudgetQuotaSpec, BudgetQuotaStatus

_DROPPED_KEYS = {"title", "default", "additionalProperties", "$defs"}


def _structural(node: Any, defs: dict[str, Any]) -> Any:
    """Turn pydantic's JSON Schema into a Kubernetes structural schema."""
    if isinstance(node, list):
        return [_structural(item, defs) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        target = defs[node["$ref"].rsplit("/", 1)[-1]]
        merged = {**target, **{k: v for k, v in node.items() if k != "$ref"}}
        return _structural(merged, defs)
    if "anyOf" in node:
        options = [o for o in node["anyOf"] if o != {"type": "null"}]
        if len(options) == 1:
            rest = {k: v for k, v in node.items() if k != "anyOf"}
            return {**_structural({**options[0], **rest}, defs), "nullable": True}
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key in _DROPPED_KEYS:
            continue
        if key == "const":
            out["enum"] = [value]
        elif key == "properties":
            out[key] = {name: _structural(sub, defs) for name, sub in value.items()}
        else:
            out[key] = _structural(value, defs)
    additional = node.get("additionalProperties")
    if isinstance(additional, dict):
        out["additionalProperties"] = _structural(additional, defs)
    if not out.get("type") and "enum" not in out and "properties" not in out:
        # Free-form values (Any) are the one place unknown fields are kept; never under spec.
        out["x-kubernetes-preserve-unknown-fields"] = True
    return out


def schema_of(model: type[BaseModel]) -> dict[str, Any]:
    raw = model.model_json_schema(by_alias=True, mode="validation")
    schema: dict[str, Any] = _structural(raw, raw.get("$defs", {}))
    schema.pop("required", None) if not raw.get("required") else None
    return schema


EPISODE_SPEC_RULES = [
    {"rule": "self.task == oldSelf.task", "message": "spec.task is immutable"},
    {"rule": "self.budgetUSD == oldSelf.budgetUSD", "message": "spec.budgetUSD is immutable"},
    {"rule": "self.backend == oldSelf.backend", "message": "spec.backend is immutable"},
    {
        "rule": "has(self.agentTokenHash) == has(oldSelf.agentTokenHash) && "
        "(!has(self.agentTokenHash) || self.agentTokenHash == oldSelf.agentTokenHash)",
        "message": "spec.agentTokenHash is immutable",
    },
    {
        "rule": "!has(oldSelf.submission) || "
        "(has(self.submission) && self.submission.checkpointFrom == oldSelf.submission.checkpointFrom)",
        "message": "spec.submission is set once and is then immutable",
    },
]
# Rules over the whole Episode (they see its status as stored: a spec write cannot change it). The
# API server checks them on the object it is about to store, so a submission and the episode's end are
# decided in one order: a submission lands only while the Episode is Running, and an end the operator
# decided without one is written only on the Episode it read (a compare-and-swap).
EPISODE_RULES = [
    {
        "rule": "!has(self.spec.submission) || has(oldSelf.spec.submission) || "
        "(has(self.status) && has(self.status.phase) && self.status.phase == 'Running')",
        "message": "spec.submission can be set only while the Episode is Running",
        "fieldPath": ".spec.submission",
    },
]
AGENTJOB_SPEC_RULES = [
    {"rule": "self == oldSelf", "message": "AgentJob spec is immutable"},
    # maxLength counts characters; the limit is in bytes (UTF-8), as the gateway and the launcher count.
    {
        "rule": f"!has(self.script) || size(bytes(self.script)) <= {MAX_SCRIPT_BYTES}",
        "message": f"spec.script is larger than {MAX_SCRIPT_BYTES} bytes (UTF-8)",
        "fieldPath": ".script",
    },
    {
        "rule": "self.purpose == 'train' || !has(self.inputsFrom) || size(self.inputsFrom) == 0",
        "message": "spec.inputsFrom is for train jobs only",
        "fieldPath": ".inputsFrom",
    },
]
JUDGEFINDING_SPEC_RULES = [{"rule": "self == oldSelf", "message": "JudgeFinding spec is immutable"}]
PROVENANCE_SPEC_RULES = [
    {"rule": "self == oldSelf", "message": "a ProvenanceRecord is append-only: its spec never changes"},
    {
        "rule": "self.writer == 'gateway' ? (has(self.toolCalls) && size(self.toolCalls) > 0 && "
        "!has(self.job) && !has(self.submission)) : ((!has(self.toolCalls) || size(self.toolCalls) == 0) "
        "&& has(self.job) != has(self.submission))",
        "message": "a gateway record holds tool calls only; an operator record one job or the submission",
    },
]
BUDGETQUOTA_SPEC_RULES = [
    {
        "rule": "has(self.period) && self.period == 'Rolling' ? has(self.windowDays) : !has(self.windowDays)",
        "message": "windowDays is required with period Rolling and refused otherwise",
    },
]
BUDGETQUOTA_RULES = [
    {
        "rule": f"self.metadata.name == '{QUOTA_NAME}'",
        "message": f"a namespace has one BudgetQuota, named {QUOTA_NAME}",
    },
]
# Rules over the whole object (they see metadata.name).
AGENTJOB_RULES = [
    {
        "rule": "!has(self.spec.inputsFrom) || !(self.metadata.name in self.spec.inputsFrom)",
        "message": "spec.inputsFrom names the job itself",
    },
]


def _crd(
    kind: str,
    plural: str,
    short_names: list[str],
    spec: type[BaseModel],
    status: type[BaseModel] | None,
    rules: list[dict[str, str]],
    columns: list[dict[str, Any]],
    description: str,
    selectable: tuple[str, ...] = (),
    object_rules: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    spec_schema = schema_of(spec)
    spec_schema["x-kubernetes-validations"] = rules
    spec_schema["description"] = f"{kind}Spec is the desired state, set by its creator."
    properties: dict[str, Any] = {
        "apiVersion": {"type": "string"},
        "kind": {"type": "string"},
        "metadata": {"type": "object"},
        "spec": spec_schema,
    }
    if status is not None:
        properties["status"] = schema_of(status)
        properties["status"]["description"] = f"{kind}Status is the observed state, written by the operator."
    schema: dict[str, Any] = {
        "type": "object",
        "description": description,
        "required": ["spec"],
        "properties": properties,
    }
    if object_rules:
        schema["x-kubernetes-validations"] = object_rules
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": plural,
                "singular": kind.lower(),
                "shortNames": short_names,
                "categories": ["posttrain"],
            },
            "versions": [_version(schema, columns, selectable, status=status is not None)],
        },
    }


def _version(
    schema: dict[str, Any], columns: list[dict[str, Any]], selectable: tuple[str, ...], *, status: bool
) -> dict[str, Any]:
    """The one served and stored version, with its status subresource where the kind has a status."""
    version: dict[str, Any] = {"name": VERSION, "served": True, "storage": True}
    if status:
        version["subresources"] = {"status": {}}
    version["additionalPrinterColumns"] = columns
    if selectable:
        version["selectableFields"] = [{"jsonPath": path} for path in selectable]
    version["schema"] = {"openAPIV3Schema": schema}
    return version


def _col(name: str, path: str, kind: str = "string", priority: int = 0) -> dict[str, Any]:
    column: dict[str, Any] = {"name": name, "type": kind, "jsonPath": path}
    if priority:
        column["priority"] = priority
    return column


def render() -> dict[str, dict[str, Any]]:
    age = _col("Age", ".metadata.creationTimestamp", "date")
    episode = _crd(
        "Episode",
        "episodes",
        ["eps"],
        EpisodeSpec,
        EpisodeStatus,
        EPISODE_SPEC_RULES,
        [
            _col("Phase", ".status.phase"),
            _col("Task", ".spec.task"),
            _col("Spent", ".status.ledger.spentUSD"),
            _col("Reserved", ".status.ledger.reservedUSD"),
            _col("Budget", ".spec.budgetUSD"),
            _col("Reward", ".status.reward"),
            _col("Steps", ".status.steps", "integer", priority=1),
            _col("Outcome", ".status.outcome", priority=1),
            age,
        ],
        "Episode is one attempt by one agent at one task, under a dollar budget.",
        object_rules=EPISODE_RULES,
    )
    agentjob = _crd(
        "AgentJob",
        "agentjobs",
        ["aj", "ajs"],
        AgentJobSpec,
        AgentJobStatus,
        AGENTJOB_SPEC_RULES,
        [
            _col("Phase", ".status.phase"),
            _col("Purpose", ".spec.purpose"),
            _col("Episode", ".spec.episode"),
            _col("Spent", ".status.spentUSD"),
            _col("Reserved", ".status.reservedUSD"),
            _col("Flavor", ".spec.flavor", priority=1),
            _col("Reason", ".status.reason", priority=1),
            _col("Backend-Job", ".status.backendJobId", priority=1),
            age,
        ],
        "AgentJob is one batch job of an Episode, run isolated on the Episode's backend.",
        selectable=(".spec.episode", ".spec.purpose"),
        object_rules=AGENTJOB_RULES,
    )
    judgefinding = _crd(
        "JudgeFinding",
        "judgefindings",
        ["jf"],
        JudgeFindingSpec,
        JudgeFindingStatus,
        JUDGEFINDING_SPEC_RULES,
        [
            _col("Episode", ".spec.episode"),
            _col("Verdict", ".spec.verdict"),
            _col("Phase", ".status.phase"),
            _col("Reason", ".status.reason", priority=1),
            age,
        ],
        "JudgeFinding is a judge's finding on an ended Episode, appended to its status.integrity.",
    )
    provenance = _crd(
        "ProvenanceRecord",
        "provenancerecords",
        ["prov"],
        ProvenanceSpec,
        None,
        PROVENANCE_SPEC_RULES,
        [
            _col("Episode", ".spec.episode"),
            _col("Writer", ".spec.writer"),
            _col("Sequence", ".spec.sequence", "integer"),
            _col("Job", ".spec.job.job", priority=1),
            age,
        ],
        "ProvenanceRecord is part of an Episode's append-only record of its tool calls, jobs and "
        "submission (format posttrain.dev/provenance/v1).",
        selectable=(".spec.episode",),
    )
    budgetquota = _crd(
        "BudgetQuota",
        "budgetquotas",
        ["bq"],
        BudgetQuotaSpec,
        BudgetQuotaStatus,
        BUDGETQUOTA_SPEC_RULES,
        [
            _col("Window", ".status.window"),
            _col("Limit", ".spec.limitUSD"),
            _col("Spent", ".status.spentUSD"),
            _col("Remaining", ".status.remainingUSD"),
            _col("Period", ".spec.period", priority=1),
            age,
        ],
        "BudgetQuota is a namespace's dollar quota per period, and the flavors, backends and Episode "
        "budgets it allows (docs/quotas.md).",
        object_rules=BUDGETQUOTA_RULES,
    )
    return {
        f"{GROUP}_budgetquotas.yaml": budgetquota,
        f"{GROUP}_episodes.yaml": episode,
        f"{GROUP}_agentjobs.yaml": agentjob,
        f"{GROUP}_judgefindings.yaml": judgefinding,
        f"{GROUP}_provenancerecords.yaml": provenance,
    }


def render_text() -> dict[str, str]:
    header = "# Generated by `make manifests` from posttrain_operator.api.models. Do not edit.\n"
    return {name: header + yaml.safe_dump(crd, sort_keys=False, width=100) for name, crd in render().items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="DIR")
    mode.add_argument("--check", type=Path, metavar="DIR")
    args = parser.parse_args(argv)
    drift = []
    for name, text in render_text().items():
        if args.write:
            args.write.mkdir(parents=True, exist_ok=True)
            (args.write / name).write_text(text)
        elif not (args.check / name).exists() or (args.check / name).read_text() != text:
            drift.append(str(args.check / name))
    if drift:
        sys.stderr.write(f"CRDs out of date (run `make manifests`): {', '.join(drift)}\n")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
