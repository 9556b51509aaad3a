"""Every scoped read in the jobs app (docs/dev/style.md rule 2)."""

from __future__ import annotations

import math
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.contrib.postgres.expressions import ArraySubquery
from django.db import connection
from django.db.models import Count, Min, OuterRef, Q, QuerySet, Sum
from django.utils import timezone

from anex.errors import NotFound
from console.models import Organization
from console.tenancy import ScopedGet, scoped_get
from jobs.constants import TERMINAL_STATUSES, ChunkStatus, DeliveryStatus, JobStatus
from jobs.models import Chunk, Input, Job, PreflightCheck, WebhookDelivery, WorkerHeartbeat


def input_get(*, organization: Organization, id: uuid.UUID | str) -> Input:
    return scoped_get(Input.objects.all(), organization=organization, id=id, noun="Input")


# Every job read by id (the polls, approve, cancel, the result...): compiled once.
_JOB_GET = ScopedGet(lambda: Job.objects.all(), noun="Job")


def job_get(*, organization: Organization, id: uuid.UUID | str) -> Job:
    return _JOB_GET(organization=organization, id=id)


# GET /jobs/{id}, the poll clients send in a loop: the job and its re-runs' ids (oldest
# first: JobOut's children) in one query, compiled once.
_JOB_READ = ScopedGet(lambda: Job.objects.annotate(children_ids=ArraySubquery(
    Job.objects.filter(parent_id=OuterRef("pk")).order_by("created_at", "id").values("pk"))),
    noun="Job")


def job_read(*, organization: Organization, id: uuid.UUID | str) -> Job:
    """job_get, with `children_ids` (JobOut's answer needs nothing more)."""
    return _JOB_READ(organization=organization, id=id)


def check_get(*, organization: Organization, id: uuid.UUID | str) -> PreflightCheck:
    return scoped_get(PreflightCheck.objects.all(), organization=organization, id=id,
                      noun="Check")


@dataclass(frozen=True)
class Progress:
    """GET /jobs/{id}/progress
    (docs/dev/decisions/2026-12-01-idempotency-keys-progress-and-the-cli.md)."""

    done_rows: int
    total_rows: int | None
    eta_seconds: int | None
    rows_per_second: float | None
    # How far GET /jobs/{id}/rows reads now (rows_readable_after).
    rows_readable_after: int = 0

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
        done=Sum("row_count", filter=Q(status=ChunkStatus.DONE)),
        # GET /jobs/{id}/rows's readable end: a contiguous plan's is in the same query.
        undone_first=Min("first_row", filter=~Q(status=ChunkStatus.DONE)),
        grouped=Count("pk", filter=Q(spans__isnull=False)))
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
    readable = _readable_after(job, done=lambda: done, end=lambda: (
        readable_end(job) if chunks["grouped"] else chunks["undone_first"]))
    return Progress(done_rows=done, total_rows=total, eta_seconds=eta, rows_per_second=rate,
                    rows_readable_after=readable)


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


# --- the fleet at a glance: the admin's operations page (jobs/admin.py), and any reader of
# the same figures (/metrics). Reads only, none scoped to an organization: staff-only. ---


@dataclass(frozen=True)
class QueueDepth:
    name: str
    ready: int  # waiting to be taken now
    delayed: int  # sent with a delay (a retry's backoff, a breaker's hand-back)


def queue_names() -> list[str]:
    """Every Dramatiq queue work is sent to (jobs.dispatch): the fixed ones, then each
    region's run, flex and sample queue of every model that is in the catalog or served."""
    from django.conf import settings

    from anex.regions import Region
    from inference.catalog import catalog
    from jobs import dispatch

    fixed = list(dispatch.FIXED_QUEUES)
    model_ids = sorted(set(catalog()) | set(settings.ANEX_CHECKPOINTS)
                       | set(settings.ANEX_WORKER_MODELS))
    return fixed + [queue for region in Region for model_id in model_ids
                    for queue in dispatch.model_queues(region.value, model_id)]


def queue_depths() -> list[QueueDepth] | None:
    """Each queue's messages in Redis (queue_names), in one round trip; None when the
    broker does not answer. A message being run is no longer counted."""
    import dramatiq
    import redis
    from dramatiq.brokers.redis import RedisBroker
    from dramatiq.common import dq_name

    from anex.broker import NAMESPACE

    broker = dramatiq.get_broker()
    if not isinstance(broker, RedisBroker):
        return None
    names = queue_names()
    try:
        with broker.client.pipeline(transaction=False) as pipe:
            for queue in names:
                pipe.llen(f"{NAMESPACE}:{queue}")
                pipe.llen(f"{NAMESPACE}:{dq_name(queue)}")
            lengths = pipe.execute()
    except redis.RedisError:
        return None
    return [QueueDepth(name=queue, ready=int(lengths[2 * i]), delayed=int(lengths[2 * i + 1]))
            for i, queue in enumerate(names)]


@dataclass(frozen=True)
class WorkerSeen:
    heartbeat: WorkerHeartbeat
    alive: bool  # beat within jobs.services.workers.ALIVE_WITHIN


def workers_seen() -> list[WorkerSeen]:
    """Every worker that beat in the last day, the live ones first."""
    from jobs.services.workers import ALIVE_WITHIN

    since = timezone.now() - ALIVE_WITHIN
    seen = [WorkerSeen(heartbeat=beat, alive=beat.beat_at >= since)
            for beat in WorkerHeartbeat.objects.order_by("hostname", "pid")]
    return sorted(seen, key=lambda worker: not worker.alive)


@dataclass(frozen=True)
class RunningJob:
    job: Job
    progress: Progress


@dataclass(frozen=True)
class ModelRunning:
    """A model's running jobs: their rows and rate summed, and the latest of their ETAs
    (job_progress_of, the one ETA rule); None while any cannot be told."""

    model: str
    jobs: list[RunningJob]
    done_rows: int
    total_rows: int
    rows_per_second: float
    eta_seconds: int | None


RUNNING_SHOWN = 200


def jobs_running_by_model() -> list[ModelRunning]:
    """The in_progress jobs (the RUNNING_SHOWN approved first), grouped by model."""
    jobs = Job.objects.filter(status=JobStatus.IN_PROGRESS).select_related(
        "organization").order_by("approved_at", "id")[:RUNNING_SHOWN]
    by_model: dict[str, list[RunningJob]] = {}
    for job in jobs:
        by_model.setdefault(job.model, []).append(
            RunningJob(job=job, progress=job_progress_of(job=job)))
    found = []
    for model, running in sorted(by_model.items()):
        etas = [item.progress.eta_seconds for item in running]
        known = [eta for eta in etas if eta is not None]
        found.append(ModelRunning(
            model=model, jobs=running,
            done_rows=sum(item.progress.done_rows for item in running),
            total_rows=sum(item.progress.total_rows or 0 for item in running),
            rows_per_second=round(sum(item.progress.rows_per_second or 0.0
                                      for item in running), 3),
            eta_seconds=max(known, default=0) if len(known) == len(etas) else None))
    return found


@dataclass(frozen=True)
class ChunkWaiting:
    chunk: Chunk
    since: datetime  # sent (queued_at), or waiting its turn since its job's approval
    sent: bool


def chunk_oldest_waiting() -> ChunkWaiting | None:
    """The pending chunk of a running job that has waited longest: to be taken from its
    queue since it was sent, or to be sent (fair dispatch) since its job was approved."""
    from django.db.models.functions import Coalesce

    chunk = Chunk.objects.filter(
        status=ChunkStatus.PENDING, job__status=JobStatus.IN_PROGRESS).select_related(
        "job").annotate(since=Coalesce("queued_at", "job__approved_at")).order_by(
        "since").first()
    if chunk is None:
        return None
    since: datetime = chunk.since  # type: ignore[attr-defined]
    return ChunkWaiting(chunk=chunk, since=since or timezone.now(),
                        sent=chunk.queued_at is not None)


@dataclass
class TierFigures:
    """One urgency tier on the operations page (docs/dev/decisions/2026-12-06-urgency-tiers.md)."""

    tier: str
    jobs_running: int = 0
    promoted: int = 0  # of them, flex jobs dispatched as standard since 48 h after approval
    chunks_waiting: int = 0  # to be sent (fair dispatch)
    chunks_in_flight: int = 0  # sent or running
    started: int = 0  # chunks started in the last hour
    wait_mean_seconds: float | None = None  # their wait from approval to start
    wait_max_seconds: float | None = None


def tier_figures(*, hours: int = 1) -> list[TierFigures]:
    """Per urgency tier: jobs running, their chunks waiting and in flight, and the queue
    wait (the job's approval to the chunk's start) of the chunks started in the last
    `hours`, in the order dispatch serves them."""
    from django.db.models import Avg, Count, DurationField, ExpressionWrapper, F, Max

    from jobs.constants import Priority
    from jobs.services.chunks import IN_FLIGHT, WAITING

    figures = {tier: TierFigures(tier=tier) for tier in
               (Priority.PRIORITY, Priority.STANDARD, Priority.FLEX)}
    running = Job.objects.filter(status=JobStatus.IN_PROGRESS)
    for row in running.values("priority").annotate(
            n=Count("pk"), promoted=Count("pk", filter=Q(promoted_at__isnull=False))):
        figures[row["priority"]].jobs_running = row["n"]
        figures[row["priority"]].promoted = row["promoted"]
    chunks = Chunk.objects.filter(job__status=JobStatus.IN_PROGRESS)
    for row in chunks.values("job__priority").annotate(
            waiting=Count("pk", filter=WAITING), flying=Count("pk", filter=IN_FLIGHT)):
        figures[row["job__priority"]].chunks_waiting = row["waiting"]
        figures[row["job__priority"]].chunks_in_flight = row["flying"]
    waited = ExpressionWrapper(F("started_at") - F("job__approved_at"),
                               output_field=DurationField())
    for row in Chunk.objects.filter(
            started_at__gte=timezone.now() - timedelta(hours=hours),
            job__approved_at__isnull=False).values("job__priority").annotate(
            n=Count("pk"), mean=Avg(waited), longest=Max(waited)):
        item = figures[row["job__priority"]]
        item.started = row["n"]
        item.wait_mean_seconds = row["mean"].total_seconds() if row["mean"] else 0.0
        item.wait_max_seconds = row["longest"].total_seconds() if row["longest"] else 0.0
    return list(figures.values())


def jobs_failed_recent(*, hours: int = 24) -> dict[str, int]:
    """Jobs that ended failed in the last `hours`, by failure code."""
    from django.db.models import Count

    rows = Job.objects.filter(status=JobStatus.FAILED,
                              finished_at__gte=timezone.now() - timedelta(hours=hours)
                              ).values("failure_code").annotate(n=Count("pk"))
    return {row["failure_code"] or "-": row["n"] for row in rows}


def deliveries_given_up_recent(*, hours: int = 24) -> int:
    """Webhook deliveries given up in the last `hours` (their last attempt was due then)."""
    return WebhookDelivery.objects.filter(
        status=DeliveryStatus.GAVE_UP,
        next_attempt_at__gte=timezone.now() - timedelta(hours=hours)).count()


# --- GET /jobs/{id}/rows: how far a job's lines can be read (jobs.services.pages) --------

# The states in which rows finish (or have finished) before the result is written.
ROWS_RUNNING = frozenset({JobStatus.IN_PROGRESS, JobStatus.CANCELLING, JobStatus.FINALIZING})
# A grouped chunk's row indexes: the first of each (row index, byte start, byte end).
SPAN_ROWS = ("CROSS JOIN LATERAL unnest(c.spans) WITH ORDINALITY AS s(row_index, place) "
             "WHERE c.job_id = %s AND c.spans IS NOT NULL AND s.place %% 3 = 1")


def job_done_rows(job: Job) -> int:
    """The rows of the job's done chunks: every row delivered, or (running) finished."""
    done = Chunk.objects.filter(job_id=job.pk, status=ChunkStatus.DONE).aggregate(
        rows=Sum("row_count"))["rows"]
    return int(done or 0)


def job_grouped(job: Job) -> bool:
    """Whether the job's chunks hold rows spread over the file (Chunk.spans)."""
    return Chunk.objects.filter(job_id=job.pk, spans__isnull=False).exists()


def readable_end(job: Job) -> int | None:
    """The first row of any chunk of the job that is not done (pending, running, failed or
    skipped): every row before it is finished. None when every chunk is done."""
    if job_grouped(job):
        with connection.cursor() as cursor:
            # The table's name and SPAN_ROWS are the code's; the values are parameters.
            cursor.execute(f"SELECT min(s.row_index) FROM {Chunk._meta.db_table} c "  # noqa: S608
                           f"{SPAN_ROWS} AND c.status <> %s", [job.pk, ChunkStatus.DONE])
            first = cursor.fetchone()[0]
    else:
        first = Chunk.objects.filter(job_id=job.pk).exclude(status=ChunkStatus.DONE) \
            .order_by("first_row").values_list("first_row", flat=True).first()
    return None if first is None else int(first)


def rows_readable_after(job: Job) -> int:
    """The cursor up to which a job's lines can be read now (progress webhooks and GET
    /jobs/{id}/progress): the readable end while it runs, every delivered line once it
    has ended with a result, 0 before a row has finished or when nothing can be read."""
    return _readable_after(job, done=lambda: job_done_rows(job),
                           end=lambda: readable_end(job))


def _readable_after(job: Job, *, done: Callable[[], int],
                    end: Callable[[], int | None]) -> int:
    """rows_readable_after, given how to count the done rows and find the readable end
    (read only when the job's state needs them)."""
    if job.data_deleted_at is not None:
        return 0
    if job.status in TERMINAL_STATUSES:
        return done() if job.result_key else 0
    if job.status not in ROWS_RUNNING:
        return 0
    first = end()
    return done() if first is None else first
