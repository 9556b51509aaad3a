"""A job's data: the result download link, DELETE /jobs/{id}/data, and the 30-day purge.

The job record (statuses, counts, cost, dates) stays; its input object, result object and
every intermediate (chunk results) are removed from storage.
"""

from __future__ import annotations

from django.db import transaction
from django.db.models import Case, F, Value, When
from django.utils import timezone

from anex.api.errors import ApiError
from console.actors import Actor
from jobs.constants import TERMINAL_STATUSES, InputStatus
from jobs.models import Input, Job
from jobs.results import chunk_key
from jobs.services.lifecycle import job_cancel, job_cancellable
from jobs.services.rows import parquet_cache_purge
from jobs.storage import storage_for

RESULT_LINK_SECONDS = 3600
DELETED = "The result data has been deleted: job payloads are kept for 30 days after completion."
STOPPING = "the job is being cancelled; its input and any result will be deleted once it stops"


def merged_key(job: Job) -> str:
    """Where GET /jobs/{id}/result?merged=true writes the job's merged result."""
    return f"results/{job.organization_id}/{job.pk}/merged.{job.format}"


def job_result_link(*, job: Job) -> dict[str, object]:
    """GET /jobs/{id}/result: a fresh presigned link, or why there is none."""
    if job.data_deleted_at is not None:
        raise ApiError(410, DELETED)
    if job.status not in TERMINAL_STATUSES:
        raise ApiError(409, f"This job is {job.status}: its result does not exist yet.")
    if not job.result_key:
        raise ApiError(409, f"This job is {job.status} and delivered no rows: there is "
                            "nothing to download.")
    url = storage_for(job.data_residency).download_url(
        job.result_key, expires_in=RESULT_LINK_SECONDS,
        filename=f"{job.pk}.{job.format}")
    rows = (job.success_rows or 0) + (job.error_rows or 0) + (job.truncated_rows or 0) \
        + (job.format_error_rows or 0)
    return {"id": str(job.pk), "status": job.status, "result_url": url,
            "expires_in": RESULT_LINK_SECONDS, "partial": bool(job.partial), "row_count": rows}


def job_data_purge(*, job: Job) -> Job:
    """Remove every object of a stopped job; the first purge's time is kept."""
    storage = storage_for(job.data_residency)
    for chunk in job.chunks.all():
        storage.delete(chunk_key(job, chunk.index))
    if job.result_key:
        storage.delete(job.result_key)
    # A merged result (jobs.services.rerun) copies its re-runs' rows: the job's own goes,
    # and so does every ancestor's that may hold this job's rows (re-made on the next
    # ?merged=true without them).
    ancestor: Job | None = job
    while ancestor is not None:
        storage_for(ancestor.data_residency).delete(merged_key(ancestor))
        ancestor = ancestor.parent
    if job.input is not None:
        storage.delete(job.input.object_key)
        # The input may be shared by other jobs: its object is gone for all of them, so it
        # reads expired, and a later submit against it is the reference's 410.
        Input.objects.filter(pk=job.input.pk, deleted_at__isnull=True).update(
            status=Case(When(status=InputStatus.READY, then=Value(InputStatus.EXPIRED)),
                        default=F("status")),
            deleted_at=timezone.now())
    parquet_cache_purge(job_id=job.pk)
    Job.objects.filter(pk=job.pk, data_deleted_at__isnull=True).update(
        data_deleted_at=timezone.now())
    job.refresh_from_db()
    return job


def job_data_delete(*, job: Job, actor: Actor) -> tuple[Job, bool]:
    """DELETE /jobs/{id}/data. Returns the job and whether its data is gone now (200)
    or will go once it has stopped (202). Idempotent."""
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(data_delete_requested=True)
        job.refresh_from_db()
        if job_cancellable(job):
            job = job_cancel(job=job, actor=actor)
    if job.status in TERMINAL_STATUSES:
        # A job that stopped just now was purged on the cancel's commit; this purge keeps
        # that first time (and covers a job that was already terminal).
        return job_data_purge(job=job), True
    # Still stopping, or still estimating (a job_transition into any terminal state purges
    # it: cancelled when its estimate is ready, or failed).
    return job, False


def results_purge_expired() -> int:
    count = 0
    due = Job.objects.filter(status__in=TERMINAL_STATUSES, data_deleted_at__isnull=True,
                             data_expires_at__lt=timezone.now())
    for job in due.select_related("input")[:500]:
        job_data_purge(job=job)
        count += 1
    return count
