"""Periodic work: a small clock that sends the sweeper actors on their schedules.

Run one or several (`python manage.py runperiodic`); a Redis lock per task and period
makes each tick fire once across all of them, and every sweeper is safe to run twice.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import dramatiq
import redis
from django.utils.module_loading import import_string

from anex.redis import redis_client

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Periodic:
    actor: str  # dotted path to a Dramatiq actor taking no arguments
    every_seconds: int


SCHEDULE = (
    # The one recovery pass: every lease in jobs.services.recovery.
    Periodic("jobs.tasks.recover_task", 30),
    Periodic("jobs.tasks.inputs_expire_task", 600),
    Periodic("jobs.tasks.results_purge_expired_task", 600),
    # Realtime usage into the ledger, in whole credits (realtime.services.settlement).
    Periodic("realtime.tasks.realtime_charges_settle_task", 30),
    # Idempotency-Key records past their 24 hours (jobs.idempotency).
    Periodic("jobs.tasks.idempotency_records_purge_task", 600),
    # Preflight checks whose read was lost are failed, never left checking.
    Periodic("jobs.tasks.checks_settle_stale_task", 600),
    # OpenAI batches past their 24-hour completion window expire (openai_api.batches).
    Periodic("openai_api.tasks.batches_expire_task", 60),
)


def tick(now: float, schedule: tuple[Periodic, ...] = SCHEDULE) -> list[str]:
    """Send every task whose period has come round; returns the ones this clock sent."""
    sent: list[str] = []
    for task in schedule:
        slot = int(now // task.every_seconds)
        lock = f"anex:periodic:{task.actor}:{slot}"
        try:
            first = redis_client().set(lock, "1", nx=True, ex=task.every_seconds * 2)
        except redis.RedisError as exc:
            logger.warning("periodic clock cannot reach Redis: %s", exc.__class__.__name__)
            return sent
        if first:
            actor: dramatiq.Actor = import_string(task.actor)  # type: ignore[type-arg]
            actor.send()
            sent.append(task.actor)
    return sent


def run_forever(should_stop: Callable[[], bool], interval: float = 5.0) -> None:
    while not should_stop():
        tick(time.time())
        time.sleep(interval)
