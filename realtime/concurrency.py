"""The per-organization limit on realtime requests in flight (429 past it), kept in Redis
so every web process shares it.

Each request in flight holds a slot: a member of the organization's sorted set, scored by
when it expires. A request gives its slot back when it ends (in a finally); one whose
process died never does, so a slot also lapses on its own SLOT_SECONDS after it was taken,
well past the engine timeout, and is swept by the next request that looks. Taking a slot is
one Lua call: sweep, count and add happen atomically, so concurrent requests cannot
overshoot. When Redis cannot be reached the request is let through, as the rate limiter
does (anex/api/throttling.py): a limiter outage must not take the API down with it.

The same call counts the request against its key's rate limit, in the counter the batch
API's throttle uses (so a key's rate is one budget across both APIs): a realtime request
then costs two Redis round trips, this one and the slot's return, instead of three. The
realtime endpoints that take a slot leave DRF's throttle off for it (realtime/api.py).
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from django.conf import settings

from anex.api.errors import rate_limited
from anex.api.throttling import RATE_LIMITER, key_rate_limit
from anex.errors import RateLimited
from anex.redis import WINDOW_SECONDS, redis_client, window_counter
from console.models import ApiKey

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
# A slot outlives any request that still runs: the engine timeout plus a margin.
SLOT_MARGIN_SECONDS = 30

# KEYS: the organization's slots, the key's rate counter. ARGV: now, the slot's expiry,
# the concurrency limit, the slot's token, the slots' lifetime, the rate limit, the rate
# counter's lifetime. Answers {the key's hits this window, 1 if a slot was taken}: no
# slot is looked for past the rate limit.
_TAKE = """
local hits = redis.call('INCR', KEYS[2])
redis.call('EXPIRE', KEYS[2], ARGV[7])
if hits > tonumber(ARGV[6]) then
  return {hits, 0}
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return {hits, 0}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[5])
return {hits, 1}
"""
_scripts: dict[int, Any] = {}


def _slots_key(organization_id: object) -> str:
    return f"anex:realtime:inflight:{organization_id}"


def slot_seconds() -> int:
    return int(settings.ANEX_REALTIME_TIMEOUT_SECONDS) + SLOT_MARGIN_SECONDS


def limit_detail(limit: int) -> str:
    return (f"Too many concurrent realtime requests: this organization already has {limit} "
            "in flight, the most it may. Wait the seconds in the Retry-After header, then "
            "retry.")


def _take(client: redis.Redis, *, organization_id: object, token: str, limit: int,
          rate_counter: str, rate_limit: int) -> tuple[int, bool]:
    """Count the request against its key's rate, then take a slot unless that is past its
    limit; (the key's hits this window, whether a slot was taken)."""
    script = _scripts.get(id(client))
    if script is None:
        script = _scripts[id(client)] = client.register_script(_TAKE)
    now = time.time()
    lifetime = slot_seconds()
    hits, taken = script(keys=[_slots_key(organization_id), rate_counter],
                         args=[now, now + lifetime, limit, token, lifetime, rate_limit,
                               WINDOW_SECONDS * 2])
    return int(hits), bool(taken)


@contextmanager
def concurrency_slot(*, key: ApiKey) -> Iterator[None]:
    """Hold one of the key's organization's realtime slots for the block; 429 when none is
    free, or (counted in the same call) when the key is past its rate limit."""
    organization_id = key.organization_id
    limit = settings.ANEX_REALTIME_CONCURRENCY
    token = uuid.uuid4().hex
    client = redis_client()
    rate_counter, seconds_left = window_counter(RATE_LIMITER, key.pk, time.time())
    rate_limit = key_rate_limit(key)
    taken: bool | None
    try:
        hits, taken = _take(client, organization_id=organization_id, token=token,
                            limit=limit, rate_counter=rate_counter, rate_limit=rate_limit)
    except redis.RedisError as exc:
        logger.warning("realtime concurrency limiter unavailable, request allowed: %s", exc)
        hits, taken = 0, None
    if taken is None:
        yield
        return
    if hits > rate_limit:
        raise rate_limited(seconds_left)  # answered as the batch API's throttle is
    if not taken:
        raise RateLimited(limit_detail(limit), retry_after=RETRY_AFTER_SECONDS,
                          code="concurrency_limit_exceeded")
    try:
        yield
    finally:
        try:
            client.zrem(_slots_key(organization_id), token)
        except redis.RedisError as exc:  # the slot lapses on its own
            logger.warning("could not give back a realtime slot: %s", exc)


def slots_in_flight(*, organization_id: object) -> int:
    """The organization's slots not yet lapsed (for tests and the admin)."""
    key = _slots_key(organization_id)
    return int(redis_client().zcount(key, time.time(), "+inf"))
