"""Running an approved job: chunks dispatched to the workers that serve its model and
region, each chunk's rows fed to the engine's running batch beside the worker's other
chunks (inference/engines/feed.py), results kept per chunk, then one result file.

Safe to run twice everywhere (docs/dev/style.md rule 6): a chunk is claimed by a guarded move and
its counts are recorded by the guarded move to done (every chunk move is
jobs.services.chunks'); its results object is keyed by the chunk, so a re-run overwrites.
A heartbeat on running chunks lets the recovery pass (jobs.services.recovery) re-queue the
work of a worker that died. The chunk that settles last sends its job's finalize to the CPU
workers (jobs.tasks.job_finalize_task), never runs it: finalizing is claimed once, holds a
lease of its own while it merges, and settles the money once.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import numpy as np
from django.conf import settings
from django.db import DatabaseError, InterfaceError, OperationalError, connection, transaction
from django.db.models import Sum

from anex.logsafe import exception_summary
from billing.services import hold_open_cents
from inference.catalog import model_get
from inference.constants import InputFormat, RowOutcome
from inference.kinds import kind_named
from inference.kinds.base import InputRow
from inference.kinds.metering import RowMeter
from inference.pricing import Usage, job_cost_usd, usage_json
from jobs.constants import CHUNK_SETTLED, ChunkStatus, FailureCode, JobStatus, Priority
from jobs.failures import (
    BREAKER_RESEND_MS,
    FailureClass,
    backoff_ms,
    breaker_for,
    failure_class,
    failure_note,
)
from jobs.jsonl import line_dumps, line_row
from jobs.models import Chunk, ChunkPlan, Job
from jobs.results import chunk_key, result_write
from jobs.services.chunks import (
    IN_FLIGHT,
    chunk_claim,
    chunk_complete,
    chunk_fail,
    chunk_heartbeat,
    chunk_requeue,
    chunk_send,
    chunk_skip,
    chunk_unsend,
    chunks_release,
    firm_pending,
)
from jobs.services.inputs import INPUT_CHANGED
from jobs.services.lifecycle import (
    WORKER,
    job_fail,
    job_finalize_send,
    job_finish,
    job_lease_beat,
    job_lease_claim,
    job_transition,
)
from jobs.services.metering import job_price_cents, job_usage_done
from jobs.services.outcomes import error_codes_count
from jobs.services.progress import job_progress_notify
from jobs.services.rows import record, rows_read
from jobs.storage import StorageChanged, storage_for
from jobs.validation.grouping import plan_arrays

logger = logging.getLogger(__name__)

def heartbeat_every() -> timedelta:
    return heartbeat_stale() / 6


def heartbeat_stale() -> timedelta:
    """A running chunk whose heartbeat is older than this belongs to a dead worker."""
    return timedelta(seconds=settings.ANEX_HEARTBEAT_STALE_SECONDS)


# A finalize's lease, apart from the chunks' heartbeat (which operators shorten so that a
# dead GPU worker's chunks move on soon: the scale harness runs on a minute): a finalize
# handed out again merges every row of its job once more, so it is handed out only after
# ten minutes without a beat, which a database failover of a few minutes does not reach.
# Its running worker beats it every minute (jobs.services.recovery, FINALIZE).
FINALIZE_LEASE_SECONDS = 600


def finalize_stale() -> timedelta:
    """A finalize whose lease is older than this was lost: its message, or its worker."""
    return timedelta(seconds=FINALIZE_LEASE_SECONDS)

CHUNK_ATTEMPTS = 3
# Failures that are not the chunk's (jobs.failures.FailureClass): how many it waits out
# before they count as attempts, and how it waits (15 s doubling to 10 min: about an hour).
CHUNK_DEFERRALS = 10
INFRA_RETRY_BASE_MS = 15_000
INFRA_RETRY_CAP_MS = 10 * 60_000
# A chunk whose results are stored waits out a short database outage to settle (a restart,
# and PgBouncer refusing logins for its server_login_retry of 15 s after it), rather than
# end its actor with the work done and the chunk left running until the stale window hands
# it out again (the scale harness's S6: a minute without a chunk finishing). The waits
# between tries; past them the error is raised, as before.
SETTLE_RETRY_SECONDS = (0.5, 1.0, 2.0, 4.0, 8.0, 8.0)


# --- starting ---------------------------------------------------------------------------


def chunks_plan(job: Job) -> list[Chunk]:
    """Split the input into chunks of ANEX_CHUNK_ROWS rows: a parquet input's by row index;
    a JSONL input's by byte ranges, from the plan its estimate recorded as the checks read
    the input (ChunkPlan), or, for a job with none at this chunk size (estimated before
    plans were kept, or under another size), read once here as a stream. A plan the
    estimate grouped (rows sharing work together, ANEX_GROUP_ROWS) is cut in its planned
    order, each chunk naming its rows' spans."""
    assert job.input is not None
    size = settings.ANEX_CHUNK_ROWS
    total = job.row_count or 0
    if job.format == InputFormat.PARQUET:
        return [Chunk(job=job, index=index, first_row=first, row_count=min(size, total - first))
                for index, first in enumerate(range(0, total, size))]
    plan = ChunkPlan.objects.filter(job=job, chunk_rows=size).first()
    if plan is not None and len(plan.chunk_ends) == -(-total // size):
        if settings.ANEX_GROUP_ROWS and plan.row_order is not None \
                and plan.row_starts is not None:
            grouped = _chunks_grouped(job, size, bytes(plan.row_order),
                                      bytes(plan.row_starts))
            if grouped is not None:
                return grouped
        return _chunks_at(job, size, total, plan.chunk_ends)
    ends: list[int] = []
    position = rows = 0
    # Read pinned to the bytes the input froze on (StorageChanged when it was swapped);
    # rows counted as the checks count them (jobs.jsonl).
    with storage_for(job.data_residency).open(job.input.object_key,
                                              pin=job.input.content_pin) as stream:
        for number, line in enumerate(stream):
            position += len(line)
            if line_row(line, first=number == 0):
                rows += 1
                if rows % size == 0:
                    ends.append(position)
    if rows % size:
        ends.append(position)  # the last chunk runs to the file's end
    return _chunks_at(job, size, rows, ends)


def _chunks_at(job: Job, size: int, rows: int, ends: list[int]) -> list[Chunk]:
    """The chunks of `rows` rows, `size` at a time, the k-th ending at byte ends[k]."""
    return [Chunk(job=job, index=index, first_row=index * size,
                  row_count=min(size, rows - index * size),
                  byte_start=ends[index - 1] if index else 0, byte_end=end)
            for index, end in enumerate(ends)]


def _chunks_grouped(job: Job, size: int, order: bytes, starts: bytes) -> list[Chunk] | None:
    """The chunks of a grouped plan (jobs.validation.grouping): `size` consecutive rows
    of the planned order each, every row named by its index and bytes (Chunk.spans), so a
    chunk reads its own rows alone. None when the plan is not the job's rows (the
    contiguous plan is used instead)."""
    rows, bounds = plan_arrays(order, starts)
    total = job.row_count or 0
    if len(rows) != total or len(bounds) != total + 1:
        return None
    index = rows.astype(np.int64)
    spans = np.stack([index, bounds[index].astype(np.int64),
                      bounds[index + 1].astype(np.int64)], axis=1)
    return [Chunk(job=job, index=number, first_row=first,
                  row_count=min(size, total - first),
                  spans=spans[first:first + size].ravel().tolist())
            for number, first in enumerate(range(0, total, size))]


def _input_unchanged(job: Job, planned: list[Chunk]) -> bool:
    """Whether the rows about to run are the ones estimated: the same count, from the
    frozen bytes. A parquet input's are checked whole here. A JSONL input's are checked
    against its pin as every range read of the run checks them (S3 compares the version or
    ETag; the local store the size and mtime), without reading it again."""
    assert job.input is not None
    if job.row_count is not None and sum(c.row_count for c in planned) != job.row_count:
        return False
    if job.input.content_pin:
        storage = storage_for(job.data_residency)
        if job.format == InputFormat.PARQUET:
            storage.verify(job.input.object_key, pin=job.input.content_pin)
        else:
            storage.read_range(job.input.object_key, 0, 1, pin=job.input.content_pin)
    return True


def job_start(*, job_id: uuid.UUID | str) -> int:
    """Plan an in_progress job's chunks (once) and release them to the dispatcher, which
    sends what its model has room for; how many of the job's chunks are then in flight.
    A job whose input is not what it was estimated on fails unbilled, never run."""
    job = Job.objects.select_related("input").get(pk=job_id)
    if job.status not in (JobStatus.IN_PROGRESS, JobStatus.CANCELLING):
        return 0
    if not job.chunks.exists():
        try:
            planned = chunks_plan(job)
            unchanged = _input_unchanged(job, planned)
        except StorageChanged:
            unchanged = False
        if not unchanged:
            logger.warning("job %s: its input changed after the estimate; failed", job.pk)
            job_fail(job=job, code=FailureCode.INVALID_INPUT, reason=INPUT_CHANGED)
            return 0
        with transaction.atomic():
            if not Chunk.objects.filter(job=job).exists():  # a concurrent start lost
                Chunk.objects.bulk_create(planned)
    if not job.chunks.exists():  # an input with no rows left to run: finish at once
        job_finalize_send(job=job)
        return 0
    # Sent as room frees on its model, fairly across organizations (chunks_release).
    chunks_release(region=job.data_residency, model=job.model)
    return job.chunks.filter(IN_FLIGHT).count()


def job_usage(job: Job) -> Usage:
    """What the job's finished chunks consumed."""
    return job_usage_done(job.pk)


def hold_reached(job: Job, usage: Usage | None = None) -> bool:
    """Whether what the job's finished chunks consumed (`usage`, when already summed)
    already reaches its hold (the reference: est_cost_cents is the most the job can
    consume). Compared exactly, at the job's tier (its price multiplier), before rounding
    up and before the minimum job price, so an honest job whose rows cost what the estimate
    counted never stops early."""
    if job.est_cost_cents is None:
        return False
    model = model_get(job.model)
    if model is None:
        return job.est_cost_cents <= 0
    spent = job_cost_usd(model, job_usage(job) if usage is None else usage, job.priority)
    return spent * 100 >= job.est_cost_cents


# --- one chunk --------------------------------------------------------------------------


class _Heartbeat:
    """Beats (`beat`: a chunk's heartbeat, a finalize's lease) while the work it guards
    runs, from its own thread and connection, every `every` (by default a chunk's)."""

    def __init__(self, beat: Callable[[], object], every: timedelta | None = None) -> None:
        self.beat = beat
        self.every = every
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._beat, daemon=True)

    def _beat(self) -> None:
        try:
            while not self.stopped.wait((self.every or heartbeat_every()).total_seconds()):
                try:
                    self.beat()
                except DatabaseError:
                    # PostgreSQL restarting, or a failover: the next beat reconnects. A
                    # beat missed is not a death; only a run of them past the stale window
                    # hands the work out again.
                    logger.warning("heartbeat failed; reconnecting for the next one",
                                   exc_info=True)
                    connection.close()
        finally:
            connection.close()

    def __enter__(self) -> _Heartbeat:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopped.set()
        self.thread.join(timeout=5)


def chunk_run(*, chunk_id: uuid.UUID | str) -> ChunkStatus | None:
    waiting = Chunk.objects.select_related("job").filter(
        pk=chunk_id, status=ChunkStatus.PENDING).first()
    if waiting is None:
        return None  # taken already, or settled: a duplicate message
    if waiting.job.dispatch_tier == Priority.FLEX and firm_pending(
            region=waiting.job.data_residency, model=waiting.job.model):
        # Flex runs only on capacity nothing else wants: a priority or standard chunk
        # waits, so this one goes back to waiting its turn, unclaimed, and this thread to
        # the worker's next message (docs/dev/decisions/2026-12-06-urgency-tiers.md).
        chunk_unsend(chunk=waiting)
        return None
    breaker = breaker_for(waiting.job.model)
    if not breaker.allows():
        # This worker's engine for the model keeps failing: the chunk goes back, unclaimed
        # and no attempt spent, for a worker whose engine answers (or this one, later).
        chunk_send(chunk=waiting, delay_ms=backoff_ms(1, base_ms=BREAKER_RESEND_MS,
                                                      cap_ms=BREAKER_RESEND_MS))
        return None
    if not chunk_claim(chunk_id=chunk_id):
        return None
    chunk = Chunk.objects.select_related("job", "job__input").get(pk=chunk_id)
    job = chunk.job
    if job.status != JobStatus.IN_PROGRESS:
        # Cancelled (or already settled): no new work starts.
        chunk_settle(chunk=chunk, to=ChunkStatus.SKIPPED)
        return ChunkStatus.SKIPPED
    if hold_reached(job):
        # Running further would be work past what approval held: the chunk is not run,
        # and the job ends failed with the rows that finished (charged at most the hold).
        logger.warning("job %s reached its hold; chunk %s not run", job.pk, chunk.index)
        chunk_settle(chunk=chunk, to=ChunkStatus.FAILED)
        return ChunkStatus.FAILED
    # Read before the run: every chunk in the engine when it fails saw it answering.
    answering = breaker.answering
    try:
        rows = rows_read(job, chunk)
        with _Heartbeat(lambda: chunk_heartbeat(chunk_id=chunk.pk)):
            results, usage = execute(job, rows)
        lines = (line_dumps(item) for item in results)
        storage_for(job.data_residency).write_stream(chunk_key(job, chunk.index), lines,
                                                     max_bytes=2**62)
    except Exception as error:
        failure = failure_class(error)
        failure_note(failure)  # the operations page's recent failures by class
        # Without the message: it may quote a row (anex.logsafe).
        logger.error("chunk %s of job %s failed (%s, attempt %s): %s", chunk.index, job.pk,
                     failure, chunk.attempts, exception_summary(error))
        if failure == FailureClass.ENGINE:
            breaker.failed()
        return _chunk_retry_or_fail(chunk, failure,
                                    suspect=failure == FailureClass.ENGINE and answering)
    breaker.succeeded()
    counts = {outcome: 0 for outcome in RowOutcome}
    for item in results:
        counts[RowOutcome(item["outcome"])] += 1
    _settle_done(chunk, counts, usage, error_codes_count(results))
    return ChunkStatus.DONE


def _settle_done(chunk: Chunk, counts: dict[RowOutcome, int], usage: Usage,
                 error_codes: dict[str, int]) -> None:
    """chunk_settle(done), through a database that fails for a while (SETTLE_RETRY_SECONDS):
    a connection the failure broke is closed and the next try opens one. The move is
    guarded, so a try after an error that hid a commit moves nothing twice."""
    for wait in (*SETTLE_RETRY_SECONDS, None):
        try:
            chunk_settle(chunk=chunk, to=ChunkStatus.DONE, counts=counts, usage=usage,
                         error_codes=error_codes)
            return
        except (OperationalError, InterfaceError) as error:
            if wait is None:
                raise
            logger.warning("chunk %s of job %s ran, but settling it met the database "
                           "failing (%s): trying again in %s s", chunk.index, chunk.job_id,
                           type(error).__name__, wait)
            connection.close()
            time.sleep(wait)


def _chunk_retry_or_fail(chunk: Chunk, failure: FailureClass = FailureClass.UNEXPECTED, *,
                         suspect: bool = False) -> ChunkStatus:
    """A failed run's chunk again, or failed for good. The infrastructure's or the engine's
    failure costs no attempt (up to CHUNK_DEFERRALS of them): it waits, backing off with
    jitter (an S3 outage of a minute is waited out, not counted three times in 15 s); the
    chunk's own failure spends one of its CHUNK_ATTEMPTS.

    `suspect`: an engine that had been answering failed on this run, so the chunk's rows may
    be what brought it down (vLLM's engine dying on a row). Once is the engine's, as any
    engine failure; the second time, on another engine or this one started again, the
    failure is the chunk's: it spends an attempt, so a poisoned chunk fails its own job
    within its attempts instead of being handed from engine to engine, unbilled, up to
    CHUNK_DEFERRALS times, bringing each down."""
    if suspect and chunk.engine_failures:
        logger.warning("chunk %s of job %s: the engine failed on it again after answering; "
                       "the chunk's fault, an attempt spent", chunk.index, chunk.job_id)
        failure = FailureClass.UNEXPECTED
    if failure != FailureClass.UNEXPECTED and chunk.deferrals < CHUNK_DEFERRALS:
        base = INFRA_RETRY_BASE_MS if failure == FailureClass.INFRASTRUCTURE \
            else BREAKER_RESEND_MS
        chunk_requeue(chunk=chunk, deferred=True, engine_failed=suspect, delay_ms=backoff_ms(
            chunk.deferrals + 1, base_ms=base, cap_ms=INFRA_RETRY_CAP_MS))
        return ChunkStatus.PENDING
    if chunk.attempts < CHUNK_ATTEMPTS:
        chunk_requeue(chunk=chunk, engine_failed=suspect, delay_ms=5_000 * chunk.attempts)
        return ChunkStatus.PENDING
    chunk_settle(chunk=chunk, to=ChunkStatus.FAILED)
    return ChunkStatus.FAILED


def chunk_settle(*, chunk: Chunk, to: ChunkStatus, reaped: bool = False,
                 counts: dict[RowOutcome, int] | None = None, usage: Usage | None = None,
                 error_codes: dict[str, int] | None = None) -> bool:
    """The one way a running chunk ends: it settles (`to` done, with its rows' `counts`,
    their `error_codes` and `usage`; failed, its attempts spent or its job's hold reached,
    or `reaped` by the recovery pass; skipped, its job cancelled), and its job's finalize
    is sent once its last chunk has. False when the move was not made (a repeat, or a
    worker that beat the recovery pass to it), and then nothing follows: whoever made it
    sends the finalize."""
    if to == ChunkStatus.DONE:
        assert counts is not None and usage is not None
        moved = chunk_complete(chunk_id=chunk.pk, counts=counts, usage=usage,
                               error_codes=error_codes)
        if moved:
            job_progress_notify(job_id=chunk.job_id)  # before finalize: its events first
    elif to == ChunkStatus.FAILED:
        moved = chunk_fail(chunk=chunk, reaped=reaped)
    elif to == ChunkStatus.SKIPPED:
        moved = chunk_skip(chunk_id=chunk.pk)
    else:
        raise ValueError(f"{to} is not a state a chunk settles in")
    if moved:
        job = chunk.job
        chunks_release(region=job.data_residency, model=job.model)
        # Read after this chunk's move committed: of two chunks settling last at once, the
        # one committing second sees both settled (both may: a second finalize is a
        # no-op). The merge runs on a CPU worker, within a time limit sized for it, never
        # here: a GPU worker's chunk thread goes back to its chunks, and the recovery
        # pass (a reaped chunk) to its other leases.
        if not Chunk.objects.filter(job_id=job.pk).exclude(
                status__in=CHUNK_SETTLED).exists():
            job_finalize_send(job=job)
    return moved


def execute(job: Job, rows: list[InputRow]) -> tuple[list[dict[str, Any]], Usage]:
    """Run the rows through the model's engine in one call (the job's task kind makes the
    engine requests and reads the outcomes); a row the engine refuses fails alone. Returns
    each row's record and what the billable rows consumed (a row that failed is never
    billed)."""
    # The rows' media (images, clips, minutes) are billed as the estimate counted them.
    meter = RowMeter(job, model_get(job.model))
    results: list[dict[str, Any]] = []
    usage = Usage()
    for row, served in zip(rows, kind_named(job.task_type).serve(job, rows, meter),
                           strict=True):
        # The row's own usage rides along: its share of the charge is priced from it.
        results.append({**record(row, served), "usage": usage_json(served.usage)})
        usage = usage + served.usage
    return results, usage


# --- finishing --------------------------------------------------------------------------


HOLD_REACHED = ("The rows consumed the whole estimate that approval held before every row "
                "ran, so the rest were not run; the rows that finished are delivered and the "
                "job is charged at most its estimate.")
CHUNKS_FAILED = ("Some rows could not be run after repeated attempts; the rows that finished "
                 "are delivered.")


def job_finalize(*, job_id: uuid.UUID | str) -> JobStatus | None:
    """Once every chunk has settled: merge the results, count, charge, and end the job
    (jobs.tasks.job_finalize_task, on a CPU worker). Claimed by one caller (in_progress/
    cancelling -> finalizing), so a duplicate message is a no-op; one whose worker died is
    handed out again by the recovery pass, and taken here once."""
    if Chunk.objects.filter(job_id=job_id).exclude(status__in=CHUNK_SETTLED).exists():
        return None
    job = Job.objects.select_related("input", "organization").get(pk=job_id)
    claimed = job_transition(job=job, to=JobStatus.FINALIZING, actor=WORKER) is not None \
        or job_lease_claim(job_id=job_id, state=JobStatus.FINALIZING)
    if not claimed:
        return None
    job.refresh_from_db()
    # Whether it was cancelling is told by its chunks: a cancelled job skipped some.
    chunks = list(job.chunks.order_by("index"))
    done = [chunk for chunk in chunks if chunk.status == ChunkStatus.DONE]
    skipped = any(chunk.status == ChunkStatus.SKIPPED for chunk in chunks)
    failed = any(chunk.status == ChunkStatus.FAILED for chunk in chunks)
    usage = job_usage(job)
    # Priced once, at the end; what the settlement will charge (never over the hold) is
    # what the result's per-row costs add up to.
    cost = min(job_price_cents(job, usage), hold_open_cents(job=job))
    # The merge streams every row once (a large job's takes hours at the slowest rate):
    # its lease is renewed meanwhile, so the recovery pass hands the finalize out only
    # when this worker died or its time limit stopped it.
    with _Heartbeat(lambda: job_lease_beat(job_id=job.pk, state=JobStatus.FINALIZING),
                    every=finalize_stale() / 10):
        written = result_write(job, done, charge=cost)
    key, delivered = written.key, written.rows
    totals = Chunk.objects.filter(pk__in=[c.pk for c in done]).aggregate(
        success=Sum("success_rows"), errors=Sum("error_rows"),
        truncated=Sum("truncated_rows"), format_errors=Sum("format_error_rows"))
    status = (JobStatus.FAILED if failed else
              JobStatus.CANCELLED if skipped or job.cancel_requested else JobStatus.DONE)
    rows = job.row_count or sum(c.row_count for c in chunks)
    accounted = sum(v or 0 for v in totals.values())
    finished = job_finish(
        job=job, status=status, cost_cents=cost,
        failure_code=FailureCode.INTERNAL_ERROR if failed else "",
        # A chunk is failed either by its attempts running out or, unrun, by the hold.
        failure_reason=(HOLD_REACHED if hold_reached(job, usage) else CHUNKS_FAILED)
        if failed else "",
        outcome={
            "success_rows": totals["success"] or 0, "error_rows": totals["errors"] or 0,
            "truncated_rows": totals["truncated"] or 0,
            "format_error_rows": totals["format_errors"] or 0,
            "pending_rows": max(rows - accounted, 0),
            "partial": status != JobStatus.DONE and delivered > 0,
            "result_key": key if delivered or status == JobStatus.DONE else "",
            # Recorded once, here: a batch read shows them without summing the chunks or
            # reading the file (openai_api.batches).
            "usage": usage_json(usage), "result_output_bytes": written.output_bytes,
            "result_error_bytes": written.error_bytes,
            "result_line_marks": written.marks,
        },
    )
    return JobStatus(finished.status)
