"""The OpenAI surface's actor: batches past their completion window expired (anex/periodic.py
sends it), on the periodic sweeps' queue."""

from __future__ import annotations

import dramatiq

from jobs import dispatch
from openai_api.batches import batches_expire

EXPIRE_TIME_LIMIT_MS = 5 * 60 * 1000


@dramatiq.actor(queue_name=dispatch.PERIODIC, max_retries=0, time_limit=EXPIRE_TIME_LIMIT_MS)
def batches_expire_task() -> None:
    batches_expire()
