"""A job's usage, summed over its chunks in the database: what its hold is checked against
before each chunk and what it is charged (what each row bills is
inference.kinds.metering.RowMeter's); recorded on the job once it has ended
(Job.usage), and read from there."""

from __future__ import annotations

import dataclasses
import uuid

from django.db.models import BigIntegerField, DecimalField, QuerySet, Sum
from django.db.models.fields.json import KeyTextTransform
from django.db.models.functions import Cast

from billing.selectors import job_money
from inference.catalog import model_get
from inference.pricing import USAGE_RENAMED, Usage, price, usage_from_json, usage_json
from jobs.constants import TERMINAL_STATUSES, ChunkStatus
from jobs.models import Chunk, Job


def usage_sum(chunks: QuerySet[Chunk]) -> Usage:
    """These chunks' usage added up in the database (the hold is checked before every
    chunk, so the chunks are never all read into Python)."""
    totals = chunks.aggregate(**{
        name: Sum(Cast(KeyTextTransform(name, "usage"),
                       DecimalField(max_digits=30, decimal_places=9)
                       if name == "media_seconds" else BigIntegerField()))
        for name in [f.name for f in dataclasses.fields(Usage)] + list(USAGE_RENAMED)})
    return usage_from_json({name: value for name, value in totals.items()
                            if value is not None})


def job_usage_done(job_id: uuid.UUID | str) -> Usage:
    """What the job's done chunks consumed: what it is charged on."""
    return usage_sum(Chunk.objects.filter(job_id=job_id, status=ChunkStatus.DONE))


def job_usage_recorded(*, job: Job) -> Usage:
    """The job's usage as recorded when it ended (Job.usage), read without a chunk; summed
    now while it runs. A job that ended before usage was recorded has it recorded now,
    once (guarded: a concurrent read records the same)."""
    if job.usage is not None:
        return usage_from_json(job.usage)
    usage = job_usage_done(job.pk)
    if job.status in TERMINAL_STATUSES:
        Job.objects.filter(pk=job.pk, usage__isnull=True).update(usage=usage_json(usage))
    return usage


def job_price_cents(job: Job, usage: Usage) -> int:
    """What `usage` of this job costs in credits, rounded up, with the model's minimum job
    price (inference.pricing.price) at the job's urgency tier: the one job-level price,
    which the finalize charges (within the hold) and the console's cost so far shows."""
    model = model_get(job.model)
    return price(model, usage, job.priority).cents if model is not None else 0


def job_cost_so_far(*, job: Job) -> int:
    """What the job would be charged were it to end now: its done chunks' usage priced as
    the finalize prices it, and never more than its hold, as the settlement charges."""
    cost = job_price_cents(job, job_usage_done(job.pk))
    held = job_money(job_id=job.pk).held
    return min(cost, held) if held else cost
