"""The one recovery pass (docs/dev/decisions/2026-12-01-job-lifecycle.md). Every piece of background
work holds a lease; the table below says, for each, which rows, which field dates the
lease, how old it may get, what is done when it runs out, and how many times before giving
up. Past the cap a job fails with internal_error and a reason in plain words (nothing is
billed that it did not consume): nothing is retried forever, nothing waits forever.

Attempts: a job's are the times this pass has had to hand its work out again (a lost
message or a dead worker alike); a chunk's and an ingest's are the times a worker claimed
it. Every action is a guarded update, so two passes at once act once.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from django.db.models import Exists, OuterRef, Q, QuerySet, Subquery
from django.db.models.functions import Greatest
from django.utils import timezone

from jobs import dispatch
from jobs.constants import (
    CHUNK_SETTLED,
    TERMINAL_STATUSES,
    ChunkStatus,
    FailureCode,
    InputStatus,
    JobStatus,
    JobSubstate,
    job_state_fields,
)
from jobs.models import Chunk, Input, Job
from jobs.services.chunks import (
    chunk_requeue,
    chunk_send,
    chunks_release,
    chunks_waiting_models,
    jobs_flex_promote,
)
from jobs.services.inputs import (
    COPY_TIME_LIMIT,
    INGEST_ATTEMPTS,
    input_copy_give_up,
    input_copy_resend,
    input_copy_revive,
)
from jobs.services.lifecycle import (
    RECOVERY,
    job_fail,
    job_finalize_send,
    job_finish,
    job_lease_renew,
)
from jobs.services.purge import job_data_purge
from jobs.services.running import CHUNK_ATTEMPTS, chunk_settle, finalize_stale, heartbeat_stale
from jobs.services.sampling import sample_send
from jobs.services.webhooks import deliveries_sweep

logger = logging.getLogger(__name__)
BATCH = 500
NOTHING_BILLED = "Nothing was billed; please submit it again."


@dataclass(frozen=True)
class Lease:
    what: str
    rows: Callable[[], QuerySet[Any]]
    field: str  # the lease's start
    max_age: Callable[[], timedelta]
    retry: Callable[[Any], object]
    # Handed out at most this many times (None: for as long as it waits its turn).
    attempts: int | None = None
    give_up: Callable[[Any], object] | None = None
    # A null lease field means never handed out: due at once.
    null_is_due: bool = False

    def due(self, now: datetime) -> QuerySet[Any]:
        stale = Q(**{f"{self.field}__lt": now - self.max_age()})
        if self.null_is_due:
            stale |= Q(**{f"{self.field}__isnull": True})
        return self.rows().filter(stale)


def _minutes(n: int) -> Callable[[], timedelta]:
    return lambda: timedelta(minutes=n)


# --- what is done: jobs --------------------------------------------------------------------


def _job_resend(send: Callable[[Job], object]) -> Callable[[Job], None]:
    def retry(job: Job) -> None:
        if job_lease_renew(job=job):
            send(job)
    return retry


def _job_give_up(reason: str) -> Callable[[Job], None]:
    def give_up(job: Job) -> None:
        logger.warning("job %s failed by the recovery pass (%s, %s attempts)", job.pk,
                       job.status, job.attempts)
        job_fail(job=job, code=FailureCode.INTERNAL_ERROR, reason=reason, actor=RECOVERY)
    return give_up


def _send_estimate(job: Job) -> None:
    # A re-run whose input was never derived (its message lost) derives it first, and
    # that task sends the estimate (jobs.services.rerun).
    derive = job.parent_id is not None and job.input_id is None
    dispatch.send("job_rerun_input_task" if derive else "job_estimate_task", str(job.pk))


def _send_sample(job: Job) -> None:
    sample_send(job, delay_ms=5_000 * job.attempts)


def _send_start(job: Job) -> None:
    dispatch.send("job_start_task", str(job.pk))


def _send_finalize(job: Job) -> None:
    # Sent, never run here: a large job's merge takes longer than this pass's own time
    # limit (jobs.tasks.SWEEP_TIME_LIMIT_MS), which would stop it at every attempt.
    job_finalize_send(job=job)


def _expire(job: Job) -> None:
    job_finish(job=job, status=JobStatus.CANCELLED, actor=RECOVERY,
               failure_reason="The estimate was not approved within 24 hours.")


def _purge(job: Job) -> None:
    job_data_purge(job=job)


# --- what is done: chunks ------------------------------------------------------------------


def _chunk_revive(chunk: Chunk) -> None:
    chunk_requeue(chunk=chunk, reaped=True)


def _chunk_give_up(chunk: Chunk) -> None:
    # The job then ends with the rows that finished (running.job_finalize).
    chunk_settle(chunk=chunk, to=ChunkStatus.FAILED, reaped=True)


def _chunk_resend(chunk: Chunk) -> None:
    chunk_send(chunk=chunk)


_ITS_CHUNKS = Chunk.objects.filter(job=OuterRef("pk"))
# Every chunk of a running job settled: its finalize is due (sent by the last to settle).
_ALL_SETTLED = Q(status__in=[JobStatus.IN_PROGRESS, JobStatus.CANCELLING]) & Q(
    Exists(_ITS_CHUNKS)) & ~Q(Exists(_ITS_CHUNKS.exclude(status__in=CHUNK_SETTLED)))


def _chunks_all_settled() -> QuerySet[Job]:
    """The jobs whose finalize was sent and not taken, with when it was last sent: when
    the last chunk settled, or when this pass sent it again (the lease renewed)."""
    last_settled = _ITS_CHUNKS.filter(finished_at__isnull=False).order_by(
        "-finished_at").values("finished_at")[:1]
    return Job.objects.filter(_ALL_SETTLED).annotate(
        finalize_sent_at=Greatest("leased_at", Subquery(last_settled)))


# --- the table ----------------------------------------------------------------------------

SUBMITTED = Lease(
    "estimate, never taken", lambda: Job.objects.filter(status=JobStatus.SUBMITTED),
    "leased_at", _minutes(5), _job_resend(_send_estimate), attempts=12,
    give_up=_job_give_up("No worker took this job's input check within an hour. "
                         + NOTHING_BILLED))
ESTIMATE = Lease(
    "estimate", lambda: Job.objects.filter(**job_state_fields(JobStatus.ESTIMATING)),
    # The job_estimate_task actor's time limit (jobs.tasks), so a live worker is never doubled.
    "leased_at", _minutes(30), _job_resend(_send_estimate), attempts=3,
    give_up=_job_give_up("We could not check this job's input. " + NOTHING_BILLED))
SAMPLE = Lease(
    "sampled estimate", lambda: Job.objects.filter(**job_state_fields(JobSubstate.SAMPLING)),
    # The run actors' time limit and a margin: an EU job may also wait for a machine.
    "leased_at", _minutes(65), _job_resend(_send_sample), attempts=3,
    give_up=_job_give_up(
        "We could not measure this job's output length on a sample. Nothing was billed; "
        "set max_output_tokens (and, on a reasoning model, reasoning_budget) to skip the "
        "sample, or submit it again."))
APPROVAL = Lease(
    # The reference: an estimate waits at most 24 hours, then cancels free of charge.
    "approval", lambda: Job.objects.filter(status=JobStatus.COST_READY),
    "cost_ready_at", lambda: timedelta(hours=24), _expire, attempts=0, give_up=_expire)
START = Lease(
    "start", lambda: Job.objects.filter(status=JobStatus.IN_PROGRESS, chunks__isnull=True),
    # The job_start_task actor's time limit: planning reads the whole input once.
    "leased_at", _minutes(16), _job_resend(_send_start), attempts=3,
    give_up=_job_give_up("We could not start running this job. " + NOTHING_BILLED))
FINALIZE_UNCLAIMED = Lease(
    # Every chunk settled, and the finalize the last one sent was not taken: its message
    # went with the broker, or with a CPU worker that died holding it. Sent again (the
    # claim makes it run once); waiting behind other finalizes on the jobs queue is not a
    # failure, so it is never given up.
    "finalize, never taken", _chunks_all_settled, "finalize_sent_at", finalize_stale,
    _job_resend(_send_finalize))
FINALIZE = Lease(
    # The finalize's own lease (running.finalize_stale), beaten by the worker merging:
    # stale, that worker died or its time limit stopped it.
    "finalize", lambda: Job.objects.filter(status=JobStatus.FINALIZING),
    "leased_at", finalize_stale, _job_resend(_send_finalize), attempts=3,
    give_up=_job_give_up("We could not assemble this job's result. " + NOTHING_BILLED))
CHUNK = Lease(
    "chunk", lambda: Chunk.objects.filter(status=ChunkStatus.RUNNING),
    "heartbeat_at", heartbeat_stale, _chunk_revive, attempts=CHUNK_ATTEMPTS,
    give_up=_chunk_give_up, null_is_due=True)
CHUNK_QUEUED = Lease(
    # Its message went with a dead worker (taken, never acknowledged), and Redis would
    # redeliver it only after its own long maintenance interval. Waiting behind other
    # jobs in the model's queue is not a failure: sent again, never given up.
    # A chunk not sent yet (no queued_at) is waiting its turn (fair dispatch): the release
    # below sends it.
    "chunk, queued", lambda: Chunk.objects.filter(
        status=ChunkStatus.PENDING, queued_at__isnull=False,
        job__status__in=[JobStatus.IN_PROGRESS, JobStatus.CANCELLING]),
    "queued_at", heartbeat_stale, _chunk_resend)
INGEST_QUEUED = Lease(
    "ingest, never taken", lambda: Input.objects.filter(status=InputStatus.PENDING),
    "created_at", lambda: timedelta(seconds=30), input_copy_resend)
INGEST_COPY = Lease(
    "ingest copy", lambda: Input.objects.filter(status=InputStatus.COPYING),
    "copy_started_at", lambda: COPY_TIME_LIMIT, input_copy_revive,
    attempts=INGEST_ATTEMPTS, give_up=input_copy_give_up, null_is_due=True)
DATA_DELETION = Lease(
    # DELETE /jobs/{id}/data is honoured on the commit that stops the job; this catches
    # a process that died in between.
    "requested data deletion", lambda: Job.objects.filter(
        status__in=TERMINAL_STATUSES, data_delete_requested=True,
        data_deleted_at__isnull=True).select_related("input"),
    "finished_at", _minutes(1), _purge)

LEASES: tuple[Lease, ...] = (
    SUBMITTED, ESTIMATE, SAMPLE, APPROVAL, START, FINALIZE_UNCLAIMED, FINALIZE, CHUNK,
    CHUNK_QUEUED, INGEST_QUEUED, INGEST_COPY, DATA_DELETION,
)


def lease_retry(lease: Lease, row: Any) -> None:
    """Hand the work out again, or past its cap do what the table says; also called by a
    worker whose step failed unexpectedly, so it is retried without waiting out its lease."""
    if lease.attempts is not None and row.attempts >= lease.attempts:
        assert lease.give_up is not None
        lease.give_up(row)
    else:
        lease.retry(row)


def lease_recover(lease: Lease, now: datetime) -> int:
    count = 0
    for row in lease.due(now)[:BATCH]:
        lease_retry(lease, row)
        count += 1
    return count


# --- a wiped broker ---------------------------------------------------------------------
#
# Redis flushed, or restarted with nothing saved, takes every queued message with it. The
# leases above would resend them only as each goes stale (minutes), BATCH at a time; the
# pass notices the wipe itself (dispatch.broker_wiped: a sentinel key gone) and at once
# sends again everything that waits for a worker, but not what the broker holds already
# (sent since it came back): the database says what is due, the broker what is queued.

# Jobs whose work waits, unclaimed, for a message: the actor it goes to, and its send.
_WAITING_JOBS: tuple[tuple[str, Callable[[], QuerySet[Job]], Callable[[Job], object]], ...] = (
    ("job_estimate_task", lambda: Job.objects.filter(status=JobStatus.SUBMITTED)
     | Job.objects.filter(claimed=False, **job_state_fields(JobStatus.ESTIMATING)),
     _send_estimate),
    ("job_sample_task", lambda: Job.objects.filter(
        claimed=False, **job_state_fields(JobSubstate.SAMPLING)), sample_send),
    ("job_start_task", lambda: Job.objects.filter(status=JobStatus.IN_PROGRESS,
                                                  chunks__isnull=True), _send_start),
    ("job_finalize_task", lambda: Job.objects.filter(
        _ALL_SETTLED | Q(claimed=False, status=JobStatus.FINALIZING)), _send_finalize),
)


def broker_wipe_recover() -> int:
    """After a broker wipe, every message it lost sent again now (no attempt counted: the
    work was never taken); how many. Nothing when the broker was not wiped."""
    if not dispatch.broker_wiped():
        return 0
    count = 0
    held = dispatch.broker_held("chunk_run_task") | dispatch.broker_held("chunk_flex_run_task")
    for chunk in CHUNK_QUEUED.rows().select_related("job").iterator():
        # chunk_send is guarded on the queued_at read: two senders at once send it once.
        if str(chunk.pk) not in held and chunk_send(chunk=chunk):
            count += 1
    for actor, rows, send in _WAITING_JOBS:
        held = dispatch.broker_held(actor)
        for job in rows().distinct().iterator():
            if str(job.pk) not in held:
                send(job)
                count += 1
    logger.warning("the broker lost its messages (its sentinel key was gone): %d sent "
                   "again", count)
    return count


def recover() -> dict[str, int]:
    """The periodic pass (jobs.tasks.recover_task): a wiped broker's messages first, every
    lease in the table, then the webhook outbox, whose deliveries carry their own lease
    and attempt cap."""
    now = timezone.now()
    counts = {"broker wiped": broker_wipe_recover()}
    counts.update({lease.what: lease_recover(lease, now) for lease in LEASES})
    # Flex jobs past their wait promoted to standard dispatch (their chunks released).
    counts["flex promoted"] = jobs_flex_promote()
    # Chunks waiting to be sent, in case no chunk's end released them (a dispatcher or a
    # start that died between its commit and its release).
    counts["chunk release"] = sum(len(chunks_release(region=region, model=model))
                                  for region, model in chunks_waiting_models())
    counts["webhook delivery"] = deliveries_sweep()
    return counts


def inputs_sweep() -> int:
    """The ingest rows of the recovery pass alone."""
    now = timezone.now()
    return lease_recover(INGEST_QUEUED, now) + lease_recover(INGEST_COPY, now)
