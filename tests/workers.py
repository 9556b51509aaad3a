"""An in-process Dramatiq worker on the real broker, for end-to-end tests."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dramatiq
from django.db import connection
from dramatiq.worker import _WorkerMiddleware


@contextmanager
def running_worker(threads: int = 1) -> Iterator[dramatiq.Worker]:
    broker = dramatiq.get_broker()
    worker = dramatiq.Worker(broker, worker_threads=threads)
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
