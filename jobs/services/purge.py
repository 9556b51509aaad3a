"""A stopped job's data removed from storage: on request (DELETE /jobs/{id}/data, a cancel
that asked for it) and 30 days after it ended. The job record (statuses, counts, cost,
dates) stays; its input object, result object and every intermediate (chunk results) go,
and so does its input's (jobs.services.inputs input_data_purge: the input's status is
written there alone).
"""

from __future__ import annotations

from django.utils import timezone

from jobs.constants import TERMINAL_STATUSES
from jobs.models import Job
from jobs.results import chunk_key
from jobs.services.inputs import input_data_purge
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


def results_purge_expired() -> int:
    count = 0
    due = Job.objects.filter(status__in=TERMINAL_STATUSES, data_deleted_at__isnull=True,
                             data_expires_at__lt=timezone.now())
    for job in due.select_related("input")[:500]:
        job_data_purge(job=job)
        count += 1
    return count
