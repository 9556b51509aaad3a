"""Every scoped read in the jobs app (STYLE.md rule 2)."""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass

from django.db.models import Q, QuerySet, Sum
from django.utils import timezone

from anex.errors import NotFound
from console.models import Organization
from console.tenancy import scoped_get
from jobs.constants import ChunkStatus, JobStatus
from jobs.models import Chunk, Input, Job, PreflightCheck, WebhookDelivery


def input_get(*, organization: Organization, id: uuid.UUID | str) -> Input:
    return scoped_get(Input.objects.all(), organization=organization, id=id, noun="Input")


def job_get(*, organization: Organization, id: uuid.UUID | str) -> Job:
    return scoped_get(Job.objects.all(), organization=organization, id=id, noun="Job")


def check_get(*, organization: Organization, id: uuid.UUID | str) -> PreflightCheck:
    return scoped_get(PreflightCheck.objects.all(), organization=organization, id=id,
                      noun="Check")


@dataclass(frozen=True)
class Progress:
    """GET /jobs/{id}/progress (docs/decisions.md, "Idempotency keys, progress and the
    CLI")."""

    done_rows: int
    total_rows: int | None
    eta_seconds: int | None
    rows_per_second: float | None

    @property
    def percent(self) -> int:
        """The rows done as a whole percentage (the console's progress bar)."""
        if not self.total_rows:
            return 0
        return min(100, round(100 * self.done_rows / self.total_rows))


def job_progress(*, organization: Organization, id: uuid.UUID | str) -> Progress:
    """GET /jobs/{id}/progress: another organization's job is 404."""
    return job_progress_of(job=job_get(organization=organization, id=id))


def job_progress_of(*, job: Job) -> Progress:
    """How far a job's run has come, from its chunks: one aggregate query, no row read.
    The API's progress and the console's pages both read it, so they tell one ETA.

    done_rows counts the rows of finished chunks (a chunk's rows finish together); the rate
    is those rows over the seconds since approval (until the job ended, for a finished
    one). eta_seconds is the rows left at that rate while the job runs, 0 once none are
    left, and null when it cannot be told: no chunk finished yet, not approved yet, or
    stopped with rows that will never run (cancelling, failed, cancelled).
    """
    chunks = Chunk.objects.filter(job_id=job.pk).aggregate(
        planned=Sum("row_count"),
        done=Sum("row_count", filter=Q(status=ChunkStatus.DONE)))
    total = job.row_count if job.row_count is not None else chunks["planned"]
    done = chunks["done"] or 0
    rate: float | None = None
    if job.approved_at is not None and done:
        elapsed = ((job.finished_at or timezone.now()) - job.approved_at).total_seconds()
        rate = round(done / max(elapsed, 0.001), 3)
    left = None if total is None else max(total - done, 0)
    eta: int | None = None
    if left == 0 and job.approved_at is not None:
        eta = 0
    elif left and rate and job.status == JobStatus.IN_PROGRESS:
        eta = math.ceil(left / rate)
    return Progress(done_rows=done, total_rows=total, eta_seconds=eta, rows_per_second=rate)


def webhook_delivery_list(*, organization: Organization) -> QuerySet[WebhookDelivery]:
    """The organization's job and test events (ingest callbacks go elsewhere)."""
    return WebhookDelivery.objects.for_org(organization).filter(input__isnull=True)


def webhook_delivery_get(*, organization: Organization, id: uuid.UUID | str) -> WebhookDelivery:
    delivery = scoped_get(WebhookDelivery.objects.all(), organization=organization, id=id,
                          noun="Delivery")
    if delivery.input_id is not None:
        raise NotFound.of("Delivery")
    return delivery


def job_list(*, organization: Organization, status: str = "",
             model: str = "") -> QuerySet[Job]:
    """Every job of the organization, newest first, optionally one status or model."""
    jobs = Job.objects.for_org(organization)
    if status:
        jobs = jobs.filter(status=status)
    if model:
        jobs = jobs.filter(model=model)
    return jobs.order_by("-created_at", "-id")


def job_models_used(*, organization: Organization) -> list[str]:
    return sorted(set(Job.objects.for_org(organization).values_list("model", flat=True)))
