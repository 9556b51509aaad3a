"""An in-process Dramatiq worker on the real broker, for end-to-end tests."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import dramatiq
from django.db import connection
from django.utils.module_loading import autodiscover_modules
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit
from dramatiq.worker import _WorkerMiddleware

from jobs.dispatch import run_queues_declare


@contextmanager
def running_worker(threads: int = 1) -> Iterator[dramatiq.Worker]:
    # Every app's actors, as `dramatiq anex.worker` loads them: the services send messages
    # by actor name and never import the actors, so a test run alone would have none.
    autodiscover_modules("tasks")
    broker = dramatiq.get_broker()
    # Idle consumers poll (and a stopping worker waits) up to worker_timeout: Dramatiq's
    # default second is paid by every test at each pickup and at the stop; 20 ms here.
    worker = dramatiq.Worker(broker, worker_threads=threads, worker_timeout=20)
    worker.start()
    try:
        yield worker
    finally:
        worker.stop()
        # Dramatiq leaves a stopped Worker subscribed to queue declarations: it would start
        # consumers for queues declared later and take messages that nothing then runs.
        broker.middleware[:] = [m for m in broker.middleware
                                if not (isinstance(m, _WorkerMiddleware) and m.worker is worker)]
        connection.close()


def broker_flush() -> None:
    """Every queue's messages gone, whether this process declared the queue or not:
    Dramatiq's flush_all empties only the queues declared here, so a queue an earlier test
    on this xdist worker sent to (before this process declared it) kept its messages, and
    the next worker took them. Seen once: a stale sample queue filled a consumer's prefetch
    and held a test's own sample in Redis past its 30 s. Only the broker's keys: anex's own
    (the wipe sentinel, rate limits) stay."""
    broker = dramatiq.get_broker()
    broker.flush_all()
    if isinstance(broker, RedisBroker):
        keys = list(broker.client.scan_iter(f"{broker.namespace}:*"))
        if keys:
            broker.client.delete(*keys)


def until(done: Callable[[], bool], timeout: float = 240) -> None:
    """Wait for done() (a worker's work landing), or fail the test."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        time.sleep(0.02)  # a tenth of a second was, on average, 40 ms more of each wait
    assert done(), "timed out"


@contextmanager
def fresh_worker(threads: int = 1) -> Iterator[Callable[..., None]]:
    """A running worker on an emptied broker with the run queues declared; yields until."""
    broker_flush()
    run_queues_declare()
    with running_worker(threads):
        yield until


def time_limits_enforced() -> None:
    """Dramatiq's time limits enforced in this process, as in a worker's: its TimeLimit
    middleware starts the thread that stops an actor past its limit at the process's boot,
    which an in-process worker (running_worker) has none of. Started once; it then stops
    only what runs past its limit (each actor's own, or its message's)."""
    for middleware in dramatiq.get_broker().middleware:
        manager = getattr(middleware, "manager", None)
        if isinstance(middleware, TimeLimit) and isinstance(manager, threading.Thread) \
                and manager.ident is None:
            manager.start()
