"""The realtime API's actor: the periodic settlement of realtime usage into the ledger
(anex/periodic.py sends it)."""

from __future__ import annotations

import dramatiq

from realtime.services import realtime_charges_settle_all

SETTLE_TIME_LIMIT_MS = 5 * 60 * 1000


@dramatiq.actor(queue_name="periodic", max_retries=0, time_limit=SETTLE_TIME_LIMIT_MS)
def realtime_charges_settle_task() -> None:
    realtime_charges_settle_all()
