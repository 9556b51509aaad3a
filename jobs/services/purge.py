"""A stopped job's data removed from storage: on request (DELETE /jobs/{id}/data, a cancel
that asked for it) and 30 days after it ended. The job record (statuses, counts, cost,
dates) stays; its input object, result object and every intermediate (chunk results) go,
and so do the failing rows quoted by the checks of its input (input_quotes_purge).
"""

from __future__ import annotations

import uuid

from django.db.models import Case, F, Value, When
from django.utils import timezone

from jobs.constants import TERMINAL_STATUSES, InputStatus
from jobs.models import Input, Job, PreflightCheck
from jobs.results import chunk_key
from jobs.services.rows import parquet_cache_purge
from jobs.storage import storage_for


def merged_key(job: Job) -> str:
    """Where GET /jobs/{id}/result?merged=true writes the job's merged result."""
    return f"results/{job.organization_id}/{job.pk}/merged.{job.format}"


def merged_stamp_key(job: Job) -> str:
    """Beside the merged result: which finished re-runs it was made from, and its row
    count (jobs.services.rerun), so an unchanged set is served without rebuilding it."""
    return f"results/{job.organization_id}/{job.pk}/merged.stamp"


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
        storage_for(ancestor.data_residency).delete(merged_stamp_key(ancestor))
        ancestor = ancestor.parent
    if job.input is not None:
        input_data_purge(item=job.input)
    parquet_cache_purge(job_id=job.pk)
    Job.objects.filter(pk=job.pk, data_deleted_at__isnull=True).update(
        data_deleted_at=timezone.now())
    job.refresh_from_db()
    return job


def input_data_purge(*, item: Input) -> bool:
    """Delete an input's object (its expiry, DELETE /jobs/{id}/data, DELETE
    /openai/v1/files/{id}); False when it is kept for now. It reads expired at once, so a
    later submit against it is the reference's 410, and its checks' quoted rows go. Its
    object is not deleted under a job that still reads it (issue 40 L11): the input may be
    shared by jobs, and one unfinished keeps the bytes until it ends; then the expiry sweep
    (jobs.services.inputs inputs_expire) deletes them."""
    # Expired first: a submit that reads the input from here on is refused, so no job
    # starts on it between the look at its jobs below and the delete.
    Input.objects.filter(pk=item.pk, deleted_at__isnull=True).update(
        status=Case(When(status=InputStatus.READY, then=Value(InputStatus.EXPIRED)),
                    default=F("status")))
    input_quotes_purge(input_id=item.pk)
    if Job.objects.filter(input_id=item.pk).exclude(status__in=TERMINAL_STATUSES).exists():
        return False
    storage_for(item.data_residency).delete(item.object_key)
    Input.objects.filter(pk=item.pk, deleted_at__isnull=True).update(deleted_at=timezone.now())
    return True


def input_quotes_purge(*, input_id: uuid.UUID) -> None:
    """A deleted input's rows are not kept elsewhere: its checks' `errors` quote them (a
    reason names a row's custom_id and its content), so they go with it; the counts stay."""
    PreflightCheck.objects.filter(input_id=input_id).exclude(errors=[]).update(errors=[])


def results_purge_expired() -> int:
    count = 0
    due = Job.objects.filter(status__in=TERMINAL_STATUSES, data_deleted_at__isnull=True,
                             data_expires_at__lt=timezone.now())
    for job in due.select_related("input")[:500]:
        job_data_purge(job=job)
        count += 1
    return count
