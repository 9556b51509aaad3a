"""A job's data as the API serves it: the result download link, and DELETE /jobs/{id}/data
(the removal itself is jobs/services/purge.py, shared with the 30-day purge)."""

from __future__ import annotations

from django.db import transaction

from anex.errors import Conflict, Gone
from console.actors import Actor
from jobs.constants import TERMINAL_STATUSES
from jobs.models import Job
from jobs.results import RESULT_LINK_SECONDS, result_download_url
from jobs.services.lifecycle import job_cancel, job_cancellable
from jobs.services.purge import job_data_purge

DELETED = "The result data has been deleted: job payloads are kept for 30 days after completion."
# A finished job with no result file: the result's 409, and the rows' (jobs.services.pages).
NOTHING_DELIVERED = ("This job is {status} and delivered no rows: there is nothing to "
                     "download.")
STOPPING = "the job is being cancelled; its input and any result will be deleted once it stops"


def job_result_link(*, job: Job) -> dict[str, object]:
    """GET /jobs/{id}/result: a fresh presigned link, or why there is none."""
    if job.data_deleted_at is not None:
        raise Gone(DELETED)
    if job.status not in TERMINAL_STATUSES:
        raise Conflict(f"This job is {job.status}: its result does not exist yet.")
    if not job.result_key:
        raise Conflict(NOTHING_DELIVERED.format(status=job.status))
    url = result_download_url(job)
    rows = (job.success_rows or 0) + (job.error_rows or 0) + (job.truncated_rows or 0) \
        + (job.format_error_rows or 0)
    return {"id": str(job.pk), "status": job.status, "result_url": url,
            "expires_in": RESULT_LINK_SECONDS, "partial": bool(job.partial), "row_count": rows}


def job_data_delete(*, job: Job, actor: Actor) -> tuple[Job, bool]:
    """DELETE /jobs/{id}/data. Returns the job and whether its data is gone now (200)
    or will go once it has stopped (202). Idempotent.

    A re-run's input is its parent's rows, copied (jobs.services.rerun): deleting the
    parent's data deletes each re-run's the same way, a re-run still running cancelled."""
    with transaction.atomic():
        Job.objects.filter(pk=job.pk).update(data_delete_requested=True)
        job.refresh_from_db()
        if job_cancellable(job):
            job = job_cancel(job=job, actor=actor)
    if job.status in TERMINAL_STATUSES:
        # A job that stopped just now was purged on the cancel's commit; this purge keeps
        # that first time (and covers a job that was already terminal).
        job = job_data_purge(job=job)
        for child in Job.objects.filter(parent=job).select_related("input"):
            job_data_delete(job=child, actor=actor)
        return job, True
    # Still stopping, or still estimating (a job_transition into any terminal state purges
    # it: cancelled when its estimate is ready, or failed).
    return job, False
