"""One Redis client per process for the web tier's own use (rate limits, locks), and the
fixed one-minute windows rate limits count in (so every web process shares the count)."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from functools import cache
from typing import Literal

import redis
from django.conf import settings

from anex.errors import Unavailable

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


LIMITER_UNAVAILABLE = ("A rate limit this request is counted against could not be checked "
                       "right now, so nothing was done: retry after the seconds in the "
                       "Retry-After header.")
LIMITER_RETRY_AFTER = 10


def window_hit(limiter: str, subject: object, *,
               fail: Literal["open", "closed"]) -> WindowHit | None:
    """Count one hit for `subject` in the current fixed window of the `limiter` counters
    (a key, a client address). When Redis cannot be reached a limiter that fails open gets
    None and lets the request through; one that fails closed raises Unavailable (503 with
    Retry-After: nothing done).
    Each caller says which (docs/decisions.md, "Limiters when Redis fails")."""
    counter, seconds_left = window_counter(limiter, subject, time.time())
    try:
        pipe = redis_client().pipeline()
        pipe.incr(counter)
        pipe.expire(counter, WINDOW_SECONDS * 2)
        count, _ = pipe.execute()
    except redis.RedisError as exc:
        if fail == "closed":
            logger.warning("%s limiter unavailable, request refused: %s", limiter, exc)
            raise Unavailable(LIMITER_UNAVAILABLE, retry_after=LIMITER_RETRY_AFTER) from None
        logger.warning("%s limiter unavailable, request allowed: %s", limiter, exc)
        return None
    return WindowHit(int(count), seconds_left)
