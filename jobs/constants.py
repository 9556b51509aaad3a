from datetime import datetime, timedelta
from typing import TypeAlias

from django.db import models

from inference.constants import RowOutcome


class JobStatus(models.TextChoices):
    """The lifecycle (docs/dev/decisions/2026-12-01-job-lifecycle.md)."""

    SUBMITTED = "submitted"
    ESTIMATING = "estimating"
    COST_READY = "cost_ready"
    IN_PROGRESS = "in_progress"
    FINALIZING = "finalizing"
    DONE = "done"
    FAILED = "failed"
    CANCELLING = "cancelling"
    CANCELLED = "cancelled"


class JobSubstate(models.TextChoices):
    """The job state machine's internal states: each a step inside one of the product's
    statuses (SUBSTATE_OF), entered and left through job_transition with its JobEvent like
    any move. Job.status keeps the status it belongs to, so the API, webhooks, the console
    and every filter by status show that status, and nothing there changes; Job.substate
    names the step (blank for a status itself). Only the machine, its events and the
    recovery pass tell the two apart."""

    # Checked and counted, waiting for (or running) its sampled estimate on a worker that
    # serves the model: the customer sees estimating.
    SAMPLING = "sampling"


SUBSTATE_OF: dict[JobSubstate, JobStatus] = {JobSubstate.SAMPLING: JobStatus.ESTIMATING}

# A state of the machine: one of the product's statuses, or a substate of one.
JobState: TypeAlias = JobStatus | JobSubstate


def job_state(status: str, substate: str = "") -> JobState:
    """The state a job's (status, substate) columns hold."""
    return JobSubstate(substate) if substate else JobStatus(status)


def job_state_fields(state: JobState | str) -> dict[str, str]:
    """The Job columns that hold `state`, as filter or update keywords: a substate is
    stored as the status it belongs to plus its own name."""
    if state in JobSubstate.values:
        substate = JobSubstate(state)
        return {"status": SUBSTATE_OF[substate], "substate": substate}
    return {"status": JobStatus(state), "substate": ""}


TERMINAL_STATUSES = frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED})

# Every move a job's status can make, from -> to (docs/dev/decisions/2026-12-01-job-lifecycle.md).
# The one writer of Job.status (jobs.services.lifecycle.job_transition) refuses any other.
JOB_TRANSITIONS: dict[JobStatus, frozenset[JobStatus]] = {
    JobStatus.SUBMITTED: frozenset({JobStatus.ESTIMATING, JobStatus.FAILED,
                                    JobStatus.CANCELLED}),
    JobStatus.ESTIMATING: frozenset({JobStatus.COST_READY, JobStatus.FAILED,
                                     JobStatus.CANCELLED}),
    JobStatus.COST_READY: frozenset({JobStatus.IN_PROGRESS, JobStatus.CANCELLED}),
    JobStatus.IN_PROGRESS: frozenset({JobStatus.CANCELLING, JobStatus.FINALIZING,
                                      JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.CANCELLING: frozenset({JobStatus.FINALIZING, JobStatus.FAILED}),
    JobStatus.FINALIZING: frozenset({JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED}),
    JobStatus.DONE: frozenset(),
    JobStatus.FAILED: frozenset(),
    JobStatus.CANCELLED: frozenset(),
}

# Every move the machine makes, the one table job_transition enforces: the statuses' moves
# above, and each substate's - entered from the status it belongs to, left only as that
# status may be left - so what a customer sees of any move is a move of JOB_TRANSITIONS
# (or none at all, on entering a substate).
JOB_STATE_TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    **{status: frozenset[JobState](targets) for status, targets in JOB_TRANSITIONS.items()},
    JobStatus.ESTIMATING: JOB_TRANSITIONS[JobStatus.ESTIMATING] | {JobSubstate.SAMPLING},
    JobSubstate.SAMPLING: frozenset({JobStatus.COST_READY, JobStatus.FAILED,
                                     JobStatus.CANCELLED}),
}

# Where a cancel stops a job at once (an in_progress job with rows running goes to
# cancelling instead). The reference refuses a cancel while estimating, except for a job
# whose data stays in the EEA: it can wait about an hour for a machine to estimate it.
# Keyed by the job's data_residency; DELETE /jobs/{id}/data cancels by the same rule.
CANCELLABLE: dict[str, frozenset[JobStatus]] = {
    "world": frozenset({JobStatus.COST_READY, JobStatus.IN_PROGRESS}),
    "eu": frozenset({JobStatus.SUBMITTED, JobStatus.ESTIMATING, JobStatus.COST_READY,
                     JobStatus.IN_PROGRESS}),
}


class TaskType(models.TextChoices):
    CHAT = "chat"
    EMBED = "embed"
    DECIDE = "decide"


# Jobs that count against the organization's approval queue (the reference: "at most 10
# jobs awaiting approval").
AWAITING_APPROVAL_STATUSES = frozenset({JobStatus.SUBMITTED, JobStatus.ESTIMATING,
                                        JobStatus.COST_READY})


class Priority(models.TextChoices):
    """A job's urgency tier (docs/dev/decisions/2026-12-06-urgency-tiers.md): what it pays
    (a price multiplier) and where its chunks wait in dispatch. standard is the
    reference's behaviour."""

    FLEX = "flex"
    STANDARD = "standard"
    PRIORITY = "priority"


# Dispatch order: a lower rank's chunks are sent first (jobs.services.chunks.chunks_release).
TIER_RANK: dict[str, int] = {Priority.PRIORITY: 0, Priority.STANDARD: 1, Priority.FLEX: 2}
# A flex job unfinished this long after its approval is promoted: dispatched as standard
# (its completion window is 72 h; the price stays flex's).
FLEX_PROMOTE_AFTER = timedelta(hours=48)


def dispatch_tier(priority: str, promoted_at: datetime | None) -> str:
    """The tier a job's chunks are dispatched in: its priority, or standard once promoted."""
    return Priority.STANDARD if promoted_at is not None else priority


class FailureCode(models.TextChoices):
    INVALID_INPUT = "invalid_input"
    INTERNAL_ERROR = "internal_error"
    # A job approved at its estimate (Job.approve_at_estimate) whose hold the balance or
    # the key's budget did not cover, or that its key may no longer approve: cancelled
    # unbilled.
    INSUFFICIENT_CREDITS = "insufficient_credits"
    NOT_APPROVED = "not_approved"


class InputStatus(models.TextChoices):
    """An input's life (the reference's POST /inputs and GET /inputs/{id})."""

    AWAITING_UPLOAD = "awaiting_upload"
    PENDING = "pending"
    COPYING = "copying"
    READY = "ready"
    FAILED = "failed"
    EXPIRED = "expired"


class DeliveryStatus(models.TextChoices):
    PENDING = "pending"
    DELIVERED = "delivered"
    GAVE_UP = "gave_up"


# Seconds between webhook delivery attempts: each gap wider than the last by more than the
# +-10% jitter, about 22 hours in all (the reference: "retried on a widening backoff for
# about a day, then given up"); ten attempts.
DELIVERY_BACKOFF_SECONDS = (5, 30, 120, 600, 1800, 5400, 14400, 21600, 36000)


class ChunkStatus(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"  # its engine call kept failing: the job ends with what else finished
    SKIPPED = "skipped"  # never started: the job was cancelled first


CHUNK_SETTLED = frozenset({ChunkStatus.DONE, ChunkStatus.FAILED, ChunkStatus.SKIPPED})

# Every move a chunk's status can make, from -> to. The one writer of Chunk.status
# (jobs.services.chunks) refuses any other; a settled chunk never moves again.
CHUNK_TRANSITIONS: dict[ChunkStatus, frozenset[ChunkStatus]] = {
    # claimed by a worker; or skipped, never started, when its job is cancelled first
    ChunkStatus.PENDING: frozenset({ChunkStatus.RUNNING, ChunkStatus.SKIPPED}),
    # its rows ran; or they kept failing, or the hold was reached; or it was claimed after
    # its job stopped; or back to pending, to be run again (its engine call failed, or its
    # worker died and the recovery pass took it back)
    ChunkStatus.RUNNING: frozenset({ChunkStatus.DONE, ChunkStatus.FAILED, ChunkStatus.SKIPPED,
                                    ChunkStatus.PENDING}),
    ChunkStatus.DONE: frozenset(),
    ChunkStatus.FAILED: frozenset(),
    ChunkStatus.SKIPPED: frozenset(),
}


class CheckStatus(models.TextChoices):
    """A preflight check's life (POST /checks): checking until every row was read."""

    CHECKING = "checking"
    PASSED = "passed"
    FAILED = "failed"


# A job that collects its failing rows (Job.collect_row_errors) keeps at most this many in
# input_errors.
INPUT_ERRORS_MAX = 1000
# A check reports at most this many failing rows (it still reads, and counts, the rest).
CHECK_ERRORS_MAX = 1000
# What a re-run may pick: the outcomes of rows that did not produce a clean answer.
RERUN_OUTCOMES = (RowOutcome.ERROR, RowOutcome.TRUNCATED, RowOutcome.FORMAT_ERROR)
# The share of a job's rows at which an opted-in organization gets a `progress` webhook.
PROGRESS_THRESHOLDS = (25, 50, 75)
