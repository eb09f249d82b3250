"""Condition types and reasons in one place, and the one function that sets a condition."""

from __future__ import annotations

from collections.abc import Iterable

from posttrain_operator.api.models import Condition

READY = "Ready"
BLOCKED = "Blocked"
ORPHANED = "Orphaned"
ADMITTED = "Admitted"
SUBMITTED = "Submitted"
COMPLETE = "Complete"
# Terminal conditions, for `kubectl wait --for=condition=...`: True once the object will not change
# phase again, whatever the outcome (Complete says whether a job succeeded).
ENDED = "Ended"  # Episode: Completed or Failed
FINISHED = "Finished"  # AgentJob: Succeeded, Failed, Cancelled or Rejected
BACKEND_READY = "BackendReady"  # Episode: its backend's credentials were accepted at the last check
EGRESS_VERIFIED = "EgressVerified"  # AgentJob (pods): its pod found every probed address closed
OVER_LIMIT = "OverLimit"  # BudgetQuota: the window's spend is above a limit lowered since
FLAVORS_OFFERED = "FlavorsOffered"  # BudgetQuota: every flavor it lists is offered by a backend it allows
UNKNOWN_FLAVOR = "UnknownFlavor"

# Reasons (PascalCase, stable: clients match on them).
ORPHANED_JOBS = "OrphanedJobs"
BUDGET_EXCEEDED = "BudgetExceeded"
QUOTA_EXCEEDED = "QuotaExceeded"  # the namespace's BudgetQuota has no room for the job
NOT_IN_QUOTA = "NotInQuota"  # the BudgetQuota does not allow the flavor, backend or budget
QUOTA_INVALID = "QuotaInvalid"  # the BudgetQuota cannot be applied: nothing is admitted
EPISODE_NOT_FOUND = "EpisodeNotFound"
EPISODE_NOT_RUNNING = "EpisodeNotRunning"
INVALID_JOB = "InvalidJob"
TOO_MANY_JOBS = "TooManyJobs"
DEV_EVALUATIONS_EXHAUSTED = "DevEvaluationsExhausted"
SUBMISSION_FAILED = "SubmissionFailed"
BACKEND_LOST = "BackendLost"
JOB_FAILED = "JobFailed"
# The launcher's own exit codes, named (jobspec.launcher_failure).
LAUNCHER_REFUSED = "LauncherRefused"
OUTPUT_CAP_EXCEEDED = "OutputCapExceeded"
FILE_CAP_EXCEEDED = "FileSizeCapExceeded"
SCRATCH_CAP_EXCEEDED = "ScratchCapExceeded"
ENVIRONMENT_UNAVAILABLE = "EnvironmentUnavailable"
DEADLINE_EXCEEDED = "DeadlineExceeded"
EPISODE_ENDED = "EpisodeEnded"
CANCEL_UNCONFIRMED = "CancelUnconfirmed"
UNKNOWN_TASK = "UnknownTask"
NETWORK_UNAVAILABLE = "NetworkUnavailable"
SANDBOX_UNAVAILABLE = "SandboxUnavailable"
PROBES_CLOSED = "ProbesClosed"
EGRESS_OPEN = "EgressOpen"


def holding(conditions: Iterable[Condition], type_: str) -> Condition | None:
    """The condition of this type, if its status is True."""
    return next((c for c in conditions if c.type == type_ and c.status == "True"), None)


def set_condition(
    conditions: list[Condition],
    type_: str,
    status: bool,
    reason: str,
    message: str,
    now: str,
    generation: int,
) -> tuple[list[Condition], bool]:
    """Return the new list and whether anything changed; lastTransitionTime moves only on a flip."""
    wanted = "True" if status else "False"
    out: list[Condition] = []
    found = False
    changed = False
    for cond in conditions:
        if cond.type != type_:
            out.append(cond)
            continue
        found = True
        flipped = cond.status != wanted
        new = cond.model_copy(
            update={
                "status": wanted,
                "reason": reason,
                "message": message[:4096],
                "observed_generation": generation,
                "last_transition_time": now if flipped else cond.last_transition_time,
            }
        )
        changed = changed or new != cond
        out.append(new)
    if not found:
        out.append(
            Condition(
                type=type_,
                status=wanted,
                reason=reason,
                message=message[:4096],
                last_transition_time=now,
                observed_generation=generation,
            )
        )
        changed = True
    return out, changed
