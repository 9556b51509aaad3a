"""Worker heartbeats: each Dramatiq worker process says every BEAT_SECONDS that it is alive,
what it serves and which engines it has loaded (jobs.models.WorkerHeartbeat), for the
admin's operations page. Kept cheap: one UPDATE a process every BEAT_SECONDS, from its own
thread and connection, and a beat that fails (the database restarting) is only logged:
the chunks' own heartbeats, not these, decide whether work is handed out again."""

from __future__ import annotations

import logging
import os
import socket
import threading
from datetime import datetime, timedelta
from pathlib import Path

import dramatiq
from django.conf import settings
from django.db import DatabaseError, connection
from django.utils import timezone

from jobs.models import WorkerHeartbeat

logger = logging.getLogger(__name__)

BEAT_SECONDS = 15.0
# A worker silent this long is shown as gone; a row silent for KEPT is deleted by the
# next beat of any worker.
ALIVE_WITHIN = timedelta(seconds=3 * BEAT_SECONDS)
KEPT = timedelta(days=1)


def worker_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def engines_loaded() -> list[str]:
    """The served model ids whose checkpoint has an engine built in this process."""
    from inference.engines.runtime import checkpoints_loaded

    loaded = {path.resolve() for path in checkpoints_loaded()}
    return sorted(model_id for model_id, path in settings.ANEX_CHECKPOINTS.items()
                  if Path(path).resolve() in loaded)


def worker_beat(*, name: str, queues: list[str], started_at: datetime | None = None) -> None:
    """Record that this worker is alive now, and what it serves."""
    now = timezone.now()
    values = {"hostname": name.rsplit(":", 1)[0], "pid": os.getpid(), "beat_at": now,
              "served_models": list(settings.ANEX_WORKER_MODELS),
              "regions": list(settings.ANEX_WORKER_REGIONS), "queues": sorted(queues),
              "engines_loaded": engines_loaded()}
    WorkerHeartbeat.objects.update_or_create(
        name=name, defaults=values, create_defaults={**values, "started_at": started_at or now})
    WorkerHeartbeat.objects.filter(beat_at__lt=now - KEPT).delete()


def worker_gone(*, name: str) -> None:
    WorkerHeartbeat.objects.filter(name=name).delete()


class WorkerHeartbeatMiddleware(dramatiq.Middleware):
    """Beats from a thread of its own while the worker runs; its row is deleted when the
    worker stops cleanly (a worker killed leaves it, shown as silent)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None
        self.name = ""

    def after_worker_boot(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.name = worker_name()
        self.stopped.clear()
        started_at = timezone.now()

        def beat() -> None:
            try:
                while True:
                    try:
                        worker_beat(name=self.name, queues=list(worker.consumers),
                                    started_at=started_at)
                    except DatabaseError as exc:
                        logger.warning("worker heartbeat failed: %s", type(exc).__name__)
                        connection.close()
                    if self.stopped.wait(BEAT_SECONDS):
                        return
            finally:
                connection.close()

        self.thread = threading.Thread(target=beat, name="worker-heartbeat", daemon=True)
        self.thread.start()

    def before_worker_shutdown(self, broker: dramatiq.Broker, worker: dramatiq.Worker) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5)
            self.thread = None
        try:
            worker_gone(name=self.name)
        except DatabaseError as exc:
            logger.warning("worker heartbeat not removed: %s", type(exc).__name__)
