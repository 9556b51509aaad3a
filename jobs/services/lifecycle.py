"""Every job state change (STYLE.md rules 1 and 3): guarded transitions, one per change,
called alike by the API, the console and the workers."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.db import transaction
from django.utils import timezone

from anex.api.errors import ApiError
from billing.services import hold_place, hold_settle, organization_lock
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction, Region
from jobs.constants import TERMINAL_STATUSES, ChunkStatus, FailureCode, JobStatus
from jobs.models import Job


def _job_lock(job: Job) -> Job:
    # Fixed order: the organization row first, then the job (billing.services).
    organization_lock(job.organization_id)
    return Job.objects.select_for_update().get(pk=job.pk)


@transaction.atomic
def job_approve(*, job: Job, actor: Actor) -> Job:
    """cost_ready -> in_progress, holding est_cost_cents in the same commit.

    409 from any other state (a retried approval included: it holds nothing twice), 402
    when the balance or the approving key's budget does not cover the estimate.
    """
    locked = _job_lock(job)
    if locked.status != JobStatus.COST_READY:
        raise ApiError(
            409, f"This job is {locked.status}: only a job in cost_ready can be approved."
        )
    locked.approved_by_key = actor.key
    locked.approved_by_user = actor.user
    hold_place(job=locked)
    updated = Job.objects.filter(pk=locked.pk, status=JobStatus.COST_READY).update(
        status=JobStatus.IN_PROGRESS, approved_at=timezone.now(),
        approved_by_key=actor.key, approved_by_user=actor.user,
    )
    assert updated == 1, "the job row is locked; its status cannot have moved"
    _run_after_commit(locked)
    locked.refresh_from_db()
    audit_record(organization=locked.organization, actor=actor,
                 action=AuditAction.JOB_APPROVED, target=locked,
                 data={"est_cost_cents": locked.est_cost_cents})
    return locked


def _run_after_commit(job: Job) -> None:
    from jobs.tasks import job_run

    transaction.on_commit(lambda: job_run.send(str(job.pk)))


@transaction.atomic
def job_finish(*, job: Job, status: JobStatus, cost_cents: int = 0,
               failure_code: FailureCode | str = "", failure_reason: str = "",
               outcome: dict[str, Any] | None = None) -> Job:
    """Move a job to a terminal state and settle its hold in the same commit; `outcome`
    (row counts, the result, partial) is recorded in that same update.

    A job already terminal is returned unchanged: finishing twice settles once.
    """
    if status not in TERMINAL_STATUSES:
        raise ValueError(f"{status} is not a terminal status")
    locked = _job_lock(job)
    if locked.status in TERMINAL_STATUSES:
        return locked
    charged = hold_settle(job=locked, cost_cents=cost_cents)
    Job.objects.filter(pk=locked.pk).update(
        status=status, finished_at=timezone.now(), cost_cents=charged,
        failure_code=failure_code, failure_reason=failure_reason, **(outcome or {}),
    )
    locked.refresh_from_db()
    return locked


TOO_LATE = frozenset({JobStatus.FINALIZING, *TERMINAL_STATUSES})
ESTIMATE_WINDOW = timedelta(hours=24)


@transaction.atomic
def job_cancel(*, job: Job, actor: Actor) -> Job:
    """The reference's cancel: immediate when no work is in flight, cancelling while rows
    run, 409 while estimating (except an EU job, which may wait an hour for a machine) and
    once finalizing or terminal. A repeat while cancelling changes nothing."""
    locked = _job_lock(job)
    status = JobStatus(locked.status)
    if status in TOO_LATE:
        raise ApiError(409, f"This job is {status.value}: it is too late to cancel it.")
    if status == JobStatus.CANCELLING:
        return locked
    if status in (JobStatus.SUBMITTED, JobStatus.ESTIMATING) \
            and locked.data_residency != Region.EU:
        raise ApiError(409, "This job is estimating: wait for cost_ready and simply never "
                            "approve it - estimates are free, and an unapproved job cancels "
                            "itself after 24 hours.")
    # Lock the chunks too (after the organization and the job): a worker's claim of a
    # pending chunk waits for this decision instead of racing it.
    chunk_states = set(locked.chunks.select_for_update().values_list("status", flat=True))
    in_flight = chunk_states & {ChunkStatus.RUNNING, ChunkStatus.DONE}
    if status == JobStatus.IN_PROGRESS and in_flight:
        # Rows are running: no new work starts, running rows finish, and the runner settles
        # the job as cancelled with the finished rows as a partial result.
        Job.objects.filter(pk=locked.pk, status=status).update(
            status=JobStatus.CANCELLING, cancel_requested=True)
        locked.refresh_from_db()
    else:
        # No work in flight: it stops now, and any hold is released in full.
        locked.chunks.filter(status=ChunkStatus.PENDING).update(
            status=ChunkStatus.SKIPPED, finished_at=timezone.now())
        locked = job_finish(job=locked, status=JobStatus.CANCELLED)
    audit_record(organization=locked.organization, actor=actor,
                 action=AuditAction.JOB_CANCELLED, target=locked,
                 data={"from": status.value, "to": locked.status})
    return locked


def jobs_expire_unapproved() -> int:
    """An estimate waits at most 24 hours: a job left in cost_ready past it is cancelled,
    free of charge."""
    cutoff = timezone.now() - ESTIMATE_WINDOW
    count = 0
    for job in Job.objects.filter(status=JobStatus.COST_READY, cost_ready_at__lt=cutoff):
        finished = job_finish(job=job, status=JobStatus.CANCELLED,
                              failure_reason="The estimate was not approved within 24 hours.")
        count += finished.status == JobStatus.CANCELLED
    return count
