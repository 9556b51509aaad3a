"""The one place work is sent: queue names, the queues a worker declares, and messages sent
by actor name, after the commit that made their row (docs/dev/style.md rule 6; readthedocs'
`send_task` by name).

    dispatch.send_on_commit("job_estimate_task", str(job.pk))
    dispatch.chunk_send(chunk_id=chunk.pk, region=job.data_residency, model=job.model)

Services never import the actors (jobs/tasks.py imports the services): a message names its
actor, and the worker that declared that actor runs it. ACTOR_QUEUES is every actor a
service sends; tests/db/test_dispatch.py holds each name to an actor jobs.tasks declares, on
the queue named here.
"""

from __future__ import annotations

import uuid
from typing import Any

import dramatiq
import redis
from django.conf import settings
from django.db import transaction
from dramatiq.brokers.redis import RedisBroker

from anex.errors import Unavailable
from anex.redis import fail_fast

BROKER_DOWN = ("The job queue is unavailable right now, so nothing was done: retry after "
               "the seconds in the Retry-After header.")

# The fixed queues: CPU work, apart from the per-model GPU queues below.
INGEST = "ingest"
WEBHOOKS = "webhooks"
PERIODIC = "periodic"
ESTIMATE = "estimate"
JOBS = "jobs"
# Free work a customer starts at will (preflight checks): apart from the estimates, whose
# jobs will be paid for, and taken after them by a worker holding both (jobs.tasks).
CHECKS = "checks"
# The default queue of the per-model actors; their messages go to run_queue/sample_queue.
RUN = "run"
SAMPLE = "sample"

# The queues a CPU worker takes (anex/roles.py), and that the operations page and /metrics
# read the depth of beside the per-model ones.
FIXED_QUEUES = (ESTIMATE, CHECKS, INGEST, WEBHOOKS, JOBS, PERIODIC)

ACTOR_QUEUES = {
    "input_copy_task": INGEST,
    "delivery_attempt_task": WEBHOOKS,
    "job_estimate_task": ESTIMATE,
    "check_run_task": CHECKS,
    "job_rerun_input_task": ESTIMATE,
    "job_start_task": JOBS,
    "job_finalize_task": JOBS,
    "chunk_run_task": RUN,
    "chunk_flex_run_task": RUN,
    "job_sample_task": SAMPLE,
}


def run_queue(region: str, model_id: str) -> str:
    """The queue a region's workers for this model consume: GPU workers take only what
    they serve."""
    return f"{RUN}.{region}.{model_id}"


def flex_queue(region: str, model_id: str) -> str:
    """The queue of a region's flex chunks for this model (docs/dev/decisions/
    2026-12-06-urgency-tiers.md): consumed by the workers that take its run queue, beside
    it, through an actor of a lower priority, so of the messages a worker holds a standard
    or priority chunk always starts before a flex one, and a flex chunk already sent never
    holds a place a standard chunk needs (chunks_release counts it apart)."""
    return f"{RUN}.{region}.{model_id}.flex"


def sample_queue(region: str, model_id: str) -> str:
    """The queue of a region's samples for this model: consumed by the workers that take
    its chunks (run_queues_declare), apart from them so samples never queue in front of
    paid chunks."""
    return f"{SAMPLE}.{region}.{model_id}"


def model_queues(region: str, model_id: str) -> tuple[str, str, str]:
    """A model's queues in a region, which the workers serving it consume: its run queue,
    its flex chunks' queue and its sample queue."""
    return run_queue(region, model_id), flex_queue(region, model_id), \
        sample_queue(region, model_id)


def run_queues_declare() -> list[str]:
    """Declare the run queues this worker consumes: one per region and served model, so a
    GPU worker only takes the chunks of the model it has loaded; and beside each its flex
    chunks' queue and its sample queue, kept apart so samples never queue in front of
    chunks, nor flex chunks in front of the others (model_queues)."""
    broker = dramatiq.get_broker()
    queues = [queue for region in settings.ANEX_WORKER_REGIONS
              for model_id in settings.ANEX_WORKER_MODELS
              for queue in model_queues(region, model_id)]
    for queue in queues:
        broker.declare_queue(queue)
    return queues


def model_queue(queue: str) -> bool:
    """Whether `queue` is a model's run or sample queue (a GPU worker's)."""
    return queue.split(".", 1)[0] in (RUN, SAMPLE)


class GpuPrefetch(dramatiq.Middleware):
    """A worker that consumes model queues takes at most one message more per queue than
    it has threads (docs/dev/decisions/2026-12-01-fair-dispatch.md: every GPU fed). Dramatiq's
    default is twice its threads: under the model's in-flight cap one worker then holds chunks it
    cannot start while another's engine runs dry, and an idle worker's consumer, backed off
    to its poll timeout, keeps losing the race for each chunk released. With one spare a
    worker's thread starts its next chunk the moment its chunk ends, and every other chunk
    in flight waits in the queue for whichever worker frees first. Dramatiq's own
    `dramatiq_queue_prefetch`, when set, is left to rule."""

    def before_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        from dramatiq import worker as dramatiq_worker

        queues = worker.consumer_whitelist or set()
        if dramatiq_worker.QUEUE_PREFETCH or not any(model_queue(q) for q in queues):
            return
        worker.queue_prefetch = gpu_prefetch(worker.worker_threads)


def gpu_prefetch(threads: int) -> int:
    """The messages a GPU worker holds per model queue: each thread's, and one spare."""
    return threads + 1


def gpu_prefetch_install() -> None:
    """GpuPrefetch on this process's broker, once (the worker's entry module)."""
    broker = dramatiq.get_broker()
    if not any(isinstance(item, GpuPrefetch) for item in broker.middleware):
        broker.add_middleware(GpuPrefetch())


def send(actor: str, *args: str, queue: str | None = None, delay_ms: int | None = None,
         time_limit_ms: int | None = None) -> None:
    """Send one message to `actor` now (on its own queue unless `queue` is given; run
    within `time_limit_ms` when given, in place of the actor's own limit)."""
    message: dramatiq.Message[Any] = dramatiq.Message(
        queue_name=queue or ACTOR_QUEUES[actor], actor_name=actor, args=args, kwargs={},
        options={} if time_limit_ms is None else {"time_limit": time_limit_ms})
    dramatiq.get_broker().enqueue(message, delay=delay_ms)


def send_on_commit(actor: str, *args: str, queue: str | None = None,
                   delay_ms: int | None = None, time_limit_ms: int | None = None) -> None:
    """send() once the current transaction commits (at once outside one), so the worker
    finds the row the message names. The work is committed by then: a broker that fails
    here is logged (robust), never a 500 for work that was done, and the recovery pass
    sends the message again from the row's lease (jobs.services.recovery)."""
    transaction.on_commit(lambda: send(actor, *args, queue=queue, delay_ms=delay_ms,
                                       time_limit_ms=time_limit_ms), robust=True)


def broker_require() -> None:
    """Unavailable (503, Retry-After) when the broker does not answer: called before a
    submit or an approval does anything, so with the broker down they change nothing
    (docs/dev/decisions/2026-12-02-failover.md). The ping fails fast (one retry, no backoff):
    through the broker's own client, with redis-py's backed-off retries, a broker that is down held
    the request and its web thread about 4 s before its 503."""
    broker = dramatiq.get_broker()
    if not isinstance(broker, RedisBroker):
        return
    try:
        _pinger_of(broker.client).ping()
    except redis.RedisError:
        raise Unavailable(BROKER_DOWN) from None


_pinger: tuple[redis.Redis, redis.Redis] | None = None


def _pinger_of(client: redis.Redis) -> redis.Redis:
    """A client to the broker's Redis with the broker client's settings but fail_fast()'s
    retry, kept for as long as the broker keeps that client."""
    global _pinger
    if _pinger is None or _pinger[0] is not client:
        pool = client.connection_pool
        twin = redis.ConnectionPool(connection_class=pool.connection_class,
                                    **{**pool.connection_kwargs, "retry": fail_fast()})
        _pinger = (client, redis.Redis(connection_pool=twin))
    return _pinger[1]


# A key the broker's Redis keeps while it keeps its messages: gone, the broker was wiped
# (flushed, or restarted with no saved data) and every message it held went with it.
BROKER_SENTINEL = "anex:broker:sentinel"


def _redis_broker() -> RedisBroker | None:
    broker = dramatiq.get_broker()
    return broker if isinstance(broker, RedisBroker) else None


def broker_wiped() -> bool:
    """Whether the broker lost its messages since this last answered no: its sentinel key
    is gone. The key is set again here (SET NX), so of two callers at once one is told."""
    broker = _redis_broker()
    return broker is not None and bool(broker.client.set(BROKER_SENTINEL, "1", nx=True))


def broker_held(actor: str) -> set[str]:
    """The first argument (the id) of every message to `actor` the broker holds: queued,
    delayed, or taken by a worker and not yet acknowledged (Dramatiq's Redis broker keeps
    each in its queue's `.msgs` hash until then; dead letters, `.XQ`, are not held work).
    A scan of the broker, for the recovery after a wipe, which is when it is nearly empty."""
    broker = _redis_broker()
    if broker is None:
        return set()
    held: set[str] = set()
    for key in broker.client.scan_iter(match=f"{broker.namespace}:*.msgs", count=1000):
        if key.endswith(b".XQ.msgs"):
            continue
        for _, raw in broker.client.hscan_iter(key, count=1000):
            message = dramatiq.Message.decode(raw)
            if message.actor_name == actor and message.args:
                held.add(str(message.args[0]))
    return held


def chunk_send(*, chunk_id: uuid.UUID, region: str, model: str,
               delay_ms: int | None = None, flex: bool = False) -> None:
    """A chunk to its model's run queue in its region; a flex one (its job dispatched in
    the flex tier) to the model's flex queue, for the lower-priority actor."""
    if flex:
        send("chunk_flex_run_task", str(chunk_id), queue=flex_queue(region, model),
             delay_ms=delay_ms)
    else:
        send("chunk_run_task", str(chunk_id), queue=run_queue(region, model),
             delay_ms=delay_ms)


def sample_send(*, job_id: uuid.UUID, region: str, model: str,
                delay_ms: int | None = None) -> None:
    """A job's sampled estimate to its model's sample queue in its region."""
    send("job_sample_task", str(job_id), queue=sample_queue(region, model), delay_ms=delay_ms)


# A finalize's time limit, from its job's rows: the merge streams every row once
# (jobs.results.result_write), so its time grows with them. Sized on a rate below the
# slowest merge measured (bench/RESULTS.md, "Finalize merge"), doubled, over a floor for
# the claim, the pricing and the settlement: an honest merge is never cut off, and a hung
# one is, for the recovery pass to hand out again (jobs.services.recovery FINALIZE).
FINALIZE_ROWS_PER_SECOND = 1_000
FINALIZE_MARGIN = 2
FINALIZE_FLOOR_MS = 10 * 60 * 1000


def finalize_time_limit_ms(rows: int) -> int:
    """The time limit of the finalize of a job of `rows` rows."""
    return FINALIZE_FLOOR_MS + FINALIZE_MARGIN * 1000 * rows // FINALIZE_ROWS_PER_SECOND


def finalize_send(*, job_id: uuid.UUID, rows: int) -> None:
    """A job's finalize to the CPU workers' jobs queue, after the commit, within the time
    its `rows` need (finalize_time_limit_ms). Never run where it is decided (a GPU
    worker's chunk thread, the recovery pass): the merge of a large job takes hours at the
    slowest rate, and the work that decided it has its own, shorter, limit."""
    send_on_commit("job_finalize_task", str(job_id), time_limit_ms=finalize_time_limit_ms(rows))
