"""`progress` webhooks: an organization that opts in (Settings, or createorg
--progress-webhooks) is sent one event when a running job's finished rows first reach each
of PROGRESS_THRESHOLDS (25, 50 and 75 % of its rows).

Called after each chunk is recorded done, before the job is finalized, so a job's progress
events are recorded (and, the outbox being ordered per job, delivered) before its
completed/failed/cancelled event. Each threshold is sent once: Job.progress_sent moves up
under the job's row lock in the same commit as the outbox rows, so a redelivered or re-run
chunk, or two chunks finishing at once, never sends one twice.
"""

from __future__ import annotations

import uuid

from django.db import transaction
from django.db.models import Q, Sum

from console.models import Organization
from jobs.constants import PROGRESS_THRESHOLDS, ChunkStatus, JobStatus
from jobs.models import Chunk, Job, WebhookDelivery
from jobs.selectors import rows_readable_after
from jobs.services.webhooks import delivery_enqueue

PROGRESS_EVENT = "progress"


def _reached(done: int, total: int) -> list[int]:
    return [t for t in PROGRESS_THRESHOLDS if total and done * 100 >= t * total]


@transaction.atomic
def job_progress_notify(*, job_id: uuid.UUID | str) -> list[WebhookDelivery]:
    """Record the progress events the job's finished rows have newly earned; returns
    them (none for an organization without the setting or an endpoint)."""
    organization = Organization.objects.filter(jobs__pk=job_id).first()
    if organization is None or not organization.progress_webhooks \
            or not organization.webhook_url:
        return []
    job = Job.objects.select_for_update().get(pk=job_id)
    if job.status not in (JobStatus.IN_PROGRESS, JobStatus.CANCELLING):
        return []
    rows = Chunk.objects.filter(job_id=job.pk).aggregate(
        planned=Sum("row_count"), done=Sum("row_count", filter=Q(status=ChunkStatus.DONE)))
    total = job.row_count if job.row_count is not None else rows["planned"] or 0
    done = rows["done"] or 0
    due = [t for t in _reached(done, total) if t > job.progress_sent]
    if not due:
        return []
    Job.objects.filter(pk=job.pk).update(progress_sent=due[-1])
    # The cursor GET /jobs/{id}/rows reads up to now (jobs.selectors).
    readable = rows_readable_after(job)
    return [delivery_enqueue(
        organization=organization, url=organization.webhook_url, event_type=PROGRESS_EVENT,
        job=job, data={"job_id": str(job.pk), "percent": threshold, "done_rows": done,
                       "total_rows": total, "rows_readable_after": readable})
        for threshold in due]
