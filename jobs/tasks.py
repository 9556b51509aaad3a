"""The jobs app's Dramatiq actors. Each takes ids, is sent after commit (jobs/dispatch.py,
by name), and is safe to run twice (STYLE.md rule 6): the service it calls claims its work
with a guarded update. Each actor is its service's name plus `_task` (`job_start` /
`job_start_task`), on the queue jobs.dispatch.ACTOR_QUEUES names. An actor, not its
service, decides what an unexpected failure of claimed work means (jobs/failures.py)."""

from __future__ import annotations

import logging

import dramatiq

from jobs import dispatch
from jobs.failures import ClaimedWorkFailed
from jobs.idempotency import idempotency_records_purge
from jobs.models import Job
from jobs.services.checks import check_run, checks_settle_stale
from jobs.services.estimation import job_estimate
from jobs.services.inputs import input_copy, inputs_expire
from jobs.services.purge import results_purge_expired
from jobs.services.recovery import ESTIMATE, SAMPLE, lease_retry, recover
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


@dramatiq.actor(queue_name=dispatch.INGEST, max_retries=0, time_limit=INGEST_TIME_LIMIT_MS)
def input_copy_task(input_id: str) -> None:
    input_copy(input_id=input_id)


@dramatiq.actor(queue_name=dispatch.WEBHOOKS, max_retries=0, time_limit=DELIVERY_TIME_LIMIT_MS)
def delivery_attempt_task(delivery_id: str) -> None:
    # Retries are the delivery's own schedule (about a day), not Dramatiq's.
    delivery_attempt(delivery_id=delivery_id)


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
    try:
        job_estimate(job_id=job_id)
    except ClaimedWorkFailed as failed:
        _hand_out_again(failed)


@dramatiq.actor(queue_name=dispatch.ESTIMATE, max_retries=0, time_limit=ESTIMATE_TIME_LIMIT_MS)
def check_run_task(check_id: str) -> None:
    # A preflight check reads a whole input as an estimate does, on the same workers.
    check_run(check_id=check_id)


@dramatiq.actor(queue_name=dispatch.JOBS, max_retries=3, time_limit=START_TIME_LIMIT_MS)
def job_start_task(job_id: str) -> None:
    job_start(job_id=job_id)


# A job whose last chunk settled without a worker's chunk_run to finalize it (a cancel
# that skipped its unsent chunks); a failure is left to the recovery pass's finalize lease.
@dramatiq.actor(queue_name=dispatch.JOBS, max_retries=0, time_limit=CHUNK_TIME_LIMIT_MS)
def job_finalize_task(job_id: str) -> None:
    job_finalize(job_id=job_id)


# Of the messages a worker holds, a lower number runs first (Dramatiq's actor priority).
# Samples go first: a sampled estimate is small (at most 64 rows, bounded by each
# organization's hourly allowance) and its rows join the engine's running batch beside the
# chunks (inference/engines/feed.py), so it costs paid work little; behind the chunks, on a
# busy model it would wait for the whole backlog (docs/decisions.md, "Samples").
CHUNK_PRIORITY = 10
SAMPLE_PRIORITY = 0


# Sent to "run.<region>.<model>" queues (jobs.dispatch.run_queue), which only the
# workers serving that model consume; the queue named here is only its default.
@dramatiq.actor(queue_name=dispatch.RUN, max_retries=0, time_limit=CHUNK_TIME_LIMIT_MS,
                priority=CHUNK_PRIORITY)
def chunk_run_task(chunk_id: str) -> None:
    chunk_run(chunk_id=chunk_id)


# Sent to "sample.<region>.<model>" queues (jobs.dispatch.sample_queue), which the
# workers serving the model consume beside its run queue, each queue with its own
# consumer: the sample needs the model's engine, but never waits in the chunks' queue.


@dramatiq.actor(queue_name=dispatch.SAMPLE, max_retries=0, time_limit=CHUNK_TIME_LIMIT_MS,
                priority=SAMPLE_PRIORITY)
def job_sample_task(job_id: str) -> None:
    try:
        job_sample(job_id=job_id)
    except ClaimedWorkFailed as failed:
        _hand_out_again(failed)


def _hand_out_again(failed: ClaimedWorkFailed) -> None:
    """Claimed work that failed unexpectedly (storage, an engine that will not start): handed
    out again now, then failed past its lease's cap (jobs.services.recovery), never left
    claimed."""
    logger.error("%s", failed, exc_info=failed.__cause__)
    lease_retry(_LEASES[failed.what], Job.objects.get(pk=failed.job_id))
