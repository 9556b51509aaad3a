"""One Redis client per process for the web tier's own use (rate limits, locks), and the
fixed one-minute windows rate limits count in (so every web process shares the count)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Literal

import redis
from django.conf import settings
from redis.backoff import NoBackoff
from redis.retry import Retry

from anex.errors import Unavailable

logger = logging.getLogger(__name__)


def fail_fast() -> Retry:
    """One retry at once, no backoff: enough for a pooled connection Redis dropped (a
    restart), while a Redis that is down costs a request milliseconds. redis-py's default
    is ten retries with exponential backoff, about 4 s on every call, which held each API
    request (and its web thread) that long before a limiter could fail open or closed."""
    return Retry(NoBackoff(), 1)


@cache
def client_for(url: str) -> redis.Redis:
    """The one client (and connection pool) this process keeps for `url`."""
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2,
                                retry=fail_fast())


def redis_client() -> redis.Redis:
    return client_for(settings.REDIS_URL)


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
    Each caller says which (docs/dev/decisions/2026-12-02-limiters-when-redis-fails.md)."""
    hits = windows_hit([(limiter, subject)], fail=fail)
    return None if hits is None else hits[0]


def windows_hit(counted: Sequence[tuple[str, object]], *,
                fail: Literal["open", "closed"]) -> list[WindowHit] | None:
    """window_hit for several (limiter, subject) pairs in one round trip (a request counted
    against its key's rate and its organization's), their hits in the same order."""
    now = time.time()
    counters = [window_counter(limiter, subject, now) for limiter, subject in counted]
    names = ", ".join(limiter for limiter, _ in counted)
    try:
        pipe = redis_client().pipeline()
        for counter, _ in counters:
            pipe.incr(counter)
            pipe.expire(counter, WINDOW_SECONDS * 2)
        answers = pipe.execute()
    except redis.RedisError as exc:
        if fail == "closed":
            logger.warning("%s limiter unavailable, request refused: %s", names, exc)
            raise Unavailable(LIMITER_UNAVAILABLE, retry_after=LIMITER_RETRY_AFTER) from None
        logger.warning("%s limiter unavailable, request allowed: %s", names, exc)
        return None
    return [WindowHit(int(answers[2 * i]), seconds_left)
            for i, (_, seconds_left) in enumerate(counters)]
