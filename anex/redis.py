"""One Redis client per process for the web tier's own use (rate limits, locks), and the
fixed one-minute windows rate limits count in (so every web process shares the count)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cache

import redis
from django.conf import settings

logger = logging.getLogger(__name__)


@cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)


def redis_client() -> redis.Redis:
    return _client_for(settings.REDIS_URL)


WINDOW_SECONDS = 60


@dataclass(frozen=True)
class WindowHit:
    count: int  # hits in this window, the one just counted included
    seconds_left: float  # until the window ends


def window_counter(limiter: str, subject: object, now: float) -> tuple[str, float]:
    """The Redis counter of `subject`'s current window, and the seconds until it ends (the
    realtime API counts a key's requests in the same one, realtime/concurrency.py)."""
    window = int(now // WINDOW_SECONDS)
    return f"anex:{limiter}:{subject}:{window}", (window + 1) * WINDOW_SECONDS - now


def window_hit(limiter: str, subject: object) -> WindowHit | None:
    """Count one hit for `subject` in the current fixed window of the `limiter` counters
    (a key, a client address); None when Redis cannot be reached, and the caller lets the
    request through."""
    counter, seconds_left = window_counter(limiter, subject, time.time())
    try:
        pipe = redis_client().pipeline()
        pipe.incr(counter)
        pipe.expire(counter, WINDOW_SECONDS * 2)
        count, _ = pipe.execute()
    except redis.RedisError as exc:
        logger.warning("%s limiter unavailable, request allowed: %s", limiter, exc)
        return None
    return WindowHit(int(count), seconds_left)
