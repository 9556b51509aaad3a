"""The jobs app's Dramatiq actors. Each takes ids, is sent after commit (jobs/dispatch.py,
by name), and is safe to run twice (docs/dev/style.md rule 6): the service it calls claims its work
with a guarded update. Each actor is its service's name plus `_task` (`job_start` /
`job_start_task`), on the queue jobs.dispatch.ACTOR_QUEUES names. An actor, not its
service, decides what an unexpected failure of claimed work means (jobs/failures.py)."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager

import dramatiq

from anex.logcontext import log_context
from anex.logsafe import exception_summary
from jobs import dispatch
from jobs.failures import ClaimedWorkFailed
from jobs.idempotency import idempotency_records_purge
from jobs.models import Chunk, Job, WebhookDelivery
from jobs.services.checks import check_run, checks_settle_stale
from jobs.services.estimation import job_estimate
from jobs.services.inputs import input_copy, inputs_expire
from jobs.services.purge import results_purge_expired
from jobs.services.recovery import ESTIMATE, SAMPLE, lease_retry, recover
from jobs.services.rerun import job_rerun_input
from jobs.services.running import chunk_run, job_finalize, job_start
from jobs.services.sampling import job_sample
from jobs.services.webhooks import delivery_attempt

logger = logging.getLogger(__name__)
# The lease each kind of claimed work is handed out again by when it fails unexpectedly.
_LEASES = {"estimate": ESTIMATE, "sample": SAMPLE}

# Time limits are explicit: a copy streams up to the input cap from a slow source. Each is
# within its lease in jobs.services.recovery, so a live worker is never doubled.
INGEST_TIME_LIMIT_MS = 65 * 60 * 1000
DELIVERY_TIME_LIMIT_MS = 60 * 1000
SWEEP_TIME_LIMIT_MS = 5 * 60 * 1000
ESTIMATE_TIME_LIMIT_MS = 30 * 60 * 1000
# One chunk's rows through the engine's running batch, beside the worker's other chunks
# (inference/engines/feed.py): generous, since a slow model on long rows takes a while; a
# worker that dies is caught sooner by the heartbeat lease.
CHUNK_TIME_LIMIT_MS = 60 * 60 * 1000
START_TIME_LIMIT_MS = 15 * 60 * 1000
# A finalize's limit is its message's, sized for its job's merge (jobs.dispatch
# finalize_send), and its lease is beaten while it runs; this serves one sent without.
FINALIZE_TIME_LIMIT_MS = 60 * 60 * 1000


@contextmanager
def _about(actor: str, subject: str, *, job_id: object = None,
           chunk_id: object = None) -> Iterator[list[object]]:
    """An actor's work on `subject` (an id), with the job (and chunk) it is about on every
    line logged inside (anex.logcontext), one line when it starts and one when it ends:
    the outcome the caller puts in the yielded list, or the exception's class (never its
    message, which may quote a row)."""
    outcome: list[object] = []
    started = time.monotonic()
    with log_context(job_id=job_id, chunk_id=chunk_id):
        logger.info("%s %s started", actor, subject)
        try:
            yield outcome
        except BaseException as error:
            logger.info("%s %s raised %s after %.2f s", actor, subject, type(error).__name__,
                        time.monotonic() - started)
            raise
        logger.info("%s %s finished in %.2f s: %s", actor, subject,
                    time.monotonic() - started, outcome[0] if outcome else None)


def _job_of_chunk(chunk_id: str) -> object:
    return Chunk.objects.filter(pk=chunk_id).values_list("job_id", flat=True).first()


def _job_of_delivery(delivery_id: str) -> object:
    return WebhookDelivery.objects.filter(pk=delivery_id).values_list(
        "job_id", flat=True).first()


@dramatiq.actor(queue_name=dispatch.INGEST, max_retries=0, time_limit=INGEST_TIME_LIMIT_MS)
def input_copy_task(input_id: str) -> None:
    with _about("ingest", input_id) as outcome:
        outcome.append(input_copy(input_id=input_id))


@dramatiq.actor(queue_name=dispatch.WEBHOOKS, max_retries=0, time_limit=DELIVERY_TIME_LIMIT_MS)
def delivery_attempt_task(delivery_id: str) -> None:
    # Retries are the delivery's own schedule (about a day), not Dramatiq's.
    with _about("delivery", delivery_id, job_id=_job_of_delivery(delivery_id)) as outcome:
        outcome.append(delivery_attempt(delivery_id=delivery_id))


@dramatiq.actor(queue_name=dispatch.PERIODIC, max_retries=0, time_limit=SWEEP_TIME_LIMIT_MS)
def recover_task() -> None:
    recover()


@dramatiq.actor(queue_name=dispatch.PERIODIC, max_retries=0, time_limit=SWEEP_TIME_LIMIT_MS)
def inputs_expire_task() -> None:
    inputs_expire()


@dramatiq.actor(queue_name=dispatch.PERIODIC, max_retries=0, time_limit=SWEEP_TIME_LIMIT_MS)
def results_purge_expired_task() -> None:
    results_purge_expired()


@dramatiq.actor(queue_name=dispatch.PERIODIC, max_retries=0, time_limit=SWEEP_TIME_LIMIT_MS)
def idempotency_records_purge_task() -> None:
    idempotency_records_purge()


@dramatiq.actor(queue_name=dispatch.PERIODIC, max_retries=0, time_limit=SWEEP_TIME_LIMIT_MS)
def checks_settle_stale_task() -> None:
    checks_settle_stale()


@dramatiq.actor(queue_name=dispatch.ESTIMATE, max_retries=0, time_limit=ESTIMATE_TIME_LIMIT_MS)
def job_estimate_task(job_id: str) -> None:
    # A crash leaves the estimate claimed; the recovery pass hands it out after its lease.
    with _about("estimate", job_id, job_id=job_id) as outcome:
        try:
            outcome.append(job_estimate(job_id=job_id))
        except ClaimedWorkFailed as failed:
            _hand_out_again(failed)


# A preflight check reads a whole input as an estimate does, for free: on its own queue,
# and a worker holding both takes its estimates first (a higher number is a lower priority).
CHECK_PRIORITY = 50


@dramatiq.actor(queue_name=dispatch.CHECKS, max_retries=0, time_limit=ESTIMATE_TIME_LIMIT_MS,
                priority=CHECK_PRIORITY)
def check_run_task(check_id: str) -> None:
    with _about("check", check_id) as outcome:
        outcome.append(check_run(check_id=check_id))


@dramatiq.actor(queue_name=dispatch.ESTIMATE, max_retries=0, time_limit=ESTIMATE_TIME_LIMIT_MS)
def job_rerun_input_task(job_id: str) -> None:
    # A re-run's rows are read from its parent's input here, not in the request; a lost
    # message is sent again by the recovery pass (a submitted job's lease).
    with _about("rerun input", job_id, job_id=job_id) as outcome:
        outcome.append(job_rerun_input(job_id=job_id))


@dramatiq.actor(queue_name=dispatch.JOBS, max_retries=3, time_limit=START_TIME_LIMIT_MS)
def job_start_task(job_id: str) -> None:
    with _about("start", job_id, job_id=job_id) as outcome:
        outcome.append(job_start(job_id=job_id))


# Every finalize runs here, on a CPU worker: sent by the chunk that settles last, by a
# start with no rows, by a cancel with nothing in flight, and by the recovery pass. A
# failure is left to the recovery pass's finalize lease.
@dramatiq.actor(queue_name=dispatch.JOBS, max_retries=0, time_limit=FINALIZE_TIME_LIMIT_MS)
def job_finalize_task(job_id: str) -> None:
    with _about("finalize", job_id, job_id=job_id) as outcome:
        outcome.append(job_finalize(job_id=job_id))


# Of the messages a worker holds, a lower number runs first (Dramatiq's actor priority).
# Samples go first: a sampled estimate is small (at most 64 rows, bounded by each
# organization's hourly allowance) and its rows join the engine's running batch beside the
# chunks (inference/engines/feed.py), so it costs paid work little; behind the chunks, on a
# busy model it would wait for the whole backlog (docs/dev/decisions/2026-12-01-fair-dispatch.md,
# "Samples never wait behind paid chunks"). Being free, samples are capped instead: a worker runs
# one at a time, and the others go back to their queue for a few seconds (jobs.services.sampling
# SAMPLES_AT_ONCE), their threads free for the chunks.
CHUNK_PRIORITY = 10
SAMPLE_PRIORITY = 0
# A flex chunk runs after every other chunk the worker holds: flex runs only on capacity
# nothing else wants (docs/dev/decisions/2026-12-06-urgency-tiers.md).
FLEX_CHUNK_PRIORITY = 20


# Sent to "run.<region>.<model>" queues (jobs.dispatch.run_queue), which only the
# workers serving that model consume; the queue named here is only its default.
@dramatiq.actor(queue_name=dispatch.RUN, max_retries=0, time_limit=CHUNK_TIME_LIMIT_MS,
                priority=CHUNK_PRIORITY)
def chunk_run_task(chunk_id: str) -> None:
    with _about("chunk", chunk_id, job_id=_job_of_chunk(chunk_id),
                chunk_id=chunk_id) as outcome:
        outcome.append(chunk_run(chunk_id=chunk_id))


# Sent to "run.<region>.<model>.flex" queues (jobs.dispatch.flex_queue): a flex job's
# chunks, the same work as chunk_run_task's at a lower priority.
@dramatiq.actor(queue_name=dispatch.RUN, max_retries=0, time_limit=CHUNK_TIME_LIMIT_MS,
                priority=FLEX_CHUNK_PRIORITY)
def chunk_flex_run_task(chunk_id: str) -> None:
    chunk_run_task.fn(chunk_id)


# Sent to "sample.<region>.<model>" queues (jobs.dispatch.sample_queue), which the
# workers serving the model consume beside its run queue, each queue with its own
# consumer: the sample needs the model's engine, but never waits in the chunks' queue.


@dramatiq.actor(queue_name=dispatch.SAMPLE, max_retries=0, time_limit=CHUNK_TIME_LIMIT_MS,
                priority=SAMPLE_PRIORITY)
def job_sample_task(job_id: str) -> None:
    with _about("sample", job_id, job_id=job_id) as outcome:
        try:
            outcome.append(job_sample(job_id=job_id))
        except ClaimedWorkFailed as failed:
            _hand_out_again(failed)


def _hand_out_again(failed: ClaimedWorkFailed) -> None:
    """Claimed work that failed unexpectedly (storage, an engine that will not start): handed
    out again now, then failed past its lease's cap (jobs.services.recovery), never left
    claimed."""
    # The cause without its message or traceback: an estimate's or a sample's failure is
    # raised with the rows in hand, and may quote them (anex.logsafe).
    cause = failed.__cause__
    logger.error("%s: %s", failed, exception_summary(cause) if cause is not None else "")
    lease_retry(_LEASES[failed.what], Job.objects.get(pk=failed.job_id))
