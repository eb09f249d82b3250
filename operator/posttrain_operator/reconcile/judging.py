"""A judge's finding (a JudgeFinding) appended to its ended Episode, once: decided by
`api.judging.judged` inside the Episode's compare-and-swap, then said in the JudgeFinding's status."""

from __future__ import annotations

from typing import Any

from posttrain_operator.api.episode import EpisodeStatus
from posttrain_operator.api.judging import JudgeFindingSpec, JudgeFindingStatus, judged, refused
from posttrain_operator.reconcile.context import Context


async def apply_judge_finding(ctx: Context, namespace: str, name: str, observed: dict[str, Any]) -> None:
    if JudgeFindingStatus.model_validate(observed.get("status") or {}).phase is not None:
        return  # applied or refused already: a finding is acted on once
    spec = JudgeFindingSpec.model_validate(observed["spec"])  # the CRD's schema already holds it to this

    def append(_: dict[str, Any], status: EpisodeStatus) -> tuple[EpisodeStatus | None, JudgeFindingStatus]:
        decided = judged(status, name, spec)
        if isinstance(decided, JudgeFindingStatus):
            return None, decided
        return decided, JudgeFindingStatus(phase="Applied", message=f"appended to Episode {spec.episode}")

    try:
        update = await ctx.kube.update_episode_status(namespace, spec.episode, append)
    except LookupError:
        outcome = refused("EpisodeNotFound", f"there is no Episode {spec.episode} in {namespace}")
    else:
        outcome = update.result
        if update.written:
            label = update.status.integrity.label if update.status.integrity else "clean"
            ctx.emit(update.body, "Warning", "JudgeFinding", f"{name}: {spec.verdict}; the label is {label}")
    await ctx.kube.patch_judgefinding_status(namespace, name, outcome)
