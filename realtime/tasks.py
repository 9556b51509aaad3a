"""The realtime API's actor: the periodic settlement of realtime usage into the ledger
(anex/periodic.py sends it), then the purge of settled usage past its retention. It runs
on a queue of its own, so the other periodic sweeps never delay it (and a deployment may
give it a worker of its own: `dramatiq anex.worker --queues realtime`)."""

from __future__ import annotations

import dramatiq

from realtime.services.settlement import realtime_charges_settle_all, realtime_usage_purge

QUEUE = "realtime"
SETTLE_TIME_LIMIT_MS = 5 * 60 * 1000


@dramatiq.actor(queue_name=QUEUE, max_retries=0, time_limit=SETTLE_TIME_LIMIT_MS)
def realtime_charges_settle_task() -> None:
    realtime_charges_settle_all()
    realtime_usage_purge()
