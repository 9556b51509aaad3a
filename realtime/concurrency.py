"""Admission of a realtime request, kept in Redis so every web process shares it: the
organization's limit on requests in flight (429 past it), and the reservation of what the
request may cost against the organization's credits and the key's spend budget (402), so
that concurrent requests cannot spend what is not there (docs/realtime.md, "Billing").

Each request in flight holds a slot: a member of the organization's sorted set, scored by
when it expires, and a reservation beside it (a hash field under the same token: the most
it may cost, in nano-dollars, and its key). A request gives both back when it ends (in a
finally), and then adds what it did cost to the organization's and the key's metered
totals; one whose process died never does, so a slot and its reservation also lapse on
their own SLOT_SECONDS after they were taken, well past the engine timeout, swept by the
next request that looks.

What a request may spend is what the ledger said was available (read at most once a
second per process, realtime.services.admission) less what realtime has metered and the ledger has
not yet charged (the metered total less the settled total, which the settlement raises
as it charges the ledger: realtime_settled_add) less every reservation in flight, less
what the jobs approved in the last seconds hold (their marks: the ledger read may be from
before their holds committed). Taking a slot is one Lua call: sweep, sum, check and add
happen atomically, so concurrent requests cannot overshoot, and an approval, which counts
the same totals and reservations (billing.unsettled), sees every reservation taken before
its own call, as every request taken after it sees its mark. The settled total is read
before the ledger is, so a settlement that lands between the two reads is counted twice
(a refusal too many), never not at all.

When Redis cannot be reached the request is refused (503): without the reservations a
request could overdraw, and realtime spends money where the batch API's rate limiter,
which lets requests through on an outage, does not.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import redis
from django.conf import settings

from anex.errors import PaymentRequired, RateLimited, Unavailable
from anex.redis import redis_client
from billing.unsettled import (
    LUA_FUNCTIONS,
    MOST_NANO,
    credits_text,
    holding_key,
    lua_script,
    metered_keys,
    nano,
    reserved_key,
    settled_keys,
    slots_key,
)
from console.models import ApiKey

logger = logging.getLogger(__name__)

RETRY_AFTER_SECONDS = 1
# A slot outlives any request that still runs: the engine timeout plus a margin.
SLOT_MARGIN_SECONDS = 30
LIMITER_UNAVAILABLE_DETAIL = ("The realtime API could not reserve this request's cost, so "
                              "nothing was done and nothing was billed. Retry.")
UNSETTLED_RETRY_AFTER_SECONDS = 30

# KEYS: the organization's slots, its reservations, its metered total, the key's metered
# total, the organization's holding marks. ARGV: now, the slot's expiry, the concurrency
# limit, the slot's token, the slots' lifetime, the request's cost, the key's id, the
# organization's room, its settled total, the key's room (-1: no budget), the key's settled
# total, the unsettled cap. Answers {0 when a slot was taken, else why not: 1 the credits,
# 2 the key's budget, 3 the cap, 4 the concurrency limit; what was already held against
# the refusing limit}.
_TAKE = LUA_FUNCTIONS + """
local now = tonumber(ARGV[1])
local cost = tonumber(ARGV[6])
local org_reserved, key_reserved = in_flight(KEYS[1], KEYS[2], now, ARGV[7])
-- Jobs approved in the last seconds count against the credits and the budget (the room may
-- be a read from before their holds), not against the cap on realtime's own spend.
local org_marked, key_marked = holding(KEYS[5], now, ARGV[7])
local org_held = math.max(0, (tonumber(redis.call('GET', KEYS[3])) or 0)
                             - tonumber(ARGV[9])) + org_reserved
if org_held + org_marked + cost > tonumber(ARGV[8]) then
  return {1, org_held + org_marked}
end
local key_room = tonumber(ARGV[10])
if key_room >= 0 then
  local key_held = math.max(0, (tonumber(redis.call('GET', KEYS[4])) or 0)
                               - tonumber(ARGV[11])) + key_reserved + key_marked
  if key_held + cost > key_room then
    return {2, key_held}
  end
end
if org_held + cost > tonumber(ARGV[12]) then
  return {3, org_held}
end
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[3]) then
  return {4, 0}
end
redis.call('ZADD', KEYS[1], ARGV[2], ARGV[4])
redis.call('HSET', KEYS[2], ARGV[4], ARGV[6] .. ' ' .. ARGV[7])
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
return {0, org_held}
"""
# KEYS: the organization's slots, its reservations, its metered total, the key's. ARGV:
# the slot's token, what the request cost (0: nothing billed).
_GIVE_BACK = """
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('HDEL', KEYS[2], ARGV[1])
if tonumber(ARGV[2]) > 0 then
  redis.call('INCRBY', KEYS[3], ARGV[2])
  redis.call('INCRBY', KEYS[4], ARGV[2])
end
return 1
"""


def slot_seconds() -> int:
    return int(settings.ANEX_REALTIME_TIMEOUT_SECONDS) + SLOT_MARGIN_SECONDS


def limit_detail(limit: int) -> str:
    return (f"Too many concurrent realtime requests: this organization already has {limit} "
            "in flight, the most it may. Wait the seconds in the Retry-After header, then "
            "retry.")


@dataclass(frozen=True)
class Room:
    """What the ledger said the organization and the key may spend (nano-dollars; the
    key's None without a budget), and the settled totals read just before it."""

    organization: int
    key: int | None
    organization_settled: int
    key_settled: int


def settled_read(*, key: ApiKey) -> tuple[int, int]:
    """The organization's and the key's settled totals (read before the ledger)."""
    values = redis_client().mget(settled_keys(key.organization_id, key.pk))
    return int(values[0] or 0), int(values[1] or 0)


def realtime_settled_add(*, organization_id: object, key_id: object, amount: int) -> None:
    """A settlement charged the ledger for `amount` nano-dollars of metered usage (less any
    fraction carried, realtime.services.settlement): that much is no longer unsettled."""
    org, key = settled_keys(organization_id, key_id)
    client = redis_client()
    with client.pipeline(transaction=True) as pipe:
        pipe.incrby(org, amount)
        pipe.incrby(key, amount)
        pipe.execute()


def unsettled_nano(*, organization_id: object) -> int:
    """The organization's metered realtime usage the ledger has not yet charged (for tests,
    the admin and the settlement's lag)."""
    client = redis_client()
    metered = client.get(metered_keys(organization_id, "-")[0])
    settled = client.get(settled_keys(organization_id, "-")[0])
    return max(0, int(metered or 0) - int(settled or 0))


class Admission:
    """A slot and its reservation, held for the block; `spend` records what the request
    cost (nano-dollars), added to the metered totals when the slot is given back."""

    def __init__(self) -> None:
        self.spent = 0

    def spend(self, amount: int) -> None:
        self.spent = amount


def _refusal(code: int, held: int, *, key: ApiKey, cost: int, room: Room) -> Exception:
    limit = settings.ANEX_REALTIME_CONCURRENCY
    if code == 1:
        return PaymentRequired(
            f"The organization's credits do not cover this request: "
            f"{credits_text(room.organization)} credits are available, realtime usage not "
            f"yet settled, requests in flight and jobs approved in the last seconds hold "
            f"{credits_text(held)}, and this request may cost up to {credits_text(cost)}. Add "
            "credits (a top-up on the console's Billing page), or retry once the requests in "
            "flight end.")
    if code == 2:
        return PaymentRequired(
            f"This API key's spend budget does not cover this request: "
            f"{credits_text(room.key or 0)} credits of it are left, realtime usage not yet "
            f"settled, requests in flight and jobs approved in the last seconds hold "
            f"{credits_text(held)}, and this request may cost up to {credits_text(cost)}. "
            "Raise the budget on the console's Keys page, or use another key.")
    if code == 3:
        return Unavailable(
            f"This organization's realtime usage waiting to be settled into the ledger has "
            f"reached its cap of {settings.ANEX_REALTIME_UNSETTLED_CAP_CREDITS:,} credits, "
            "so nothing was done. Retry after the seconds in the Retry-After header.",
            retry_after=UNSETTLED_RETRY_AFTER_SECONDS)
    return RateLimited(limit_detail(limit), retry_after=RETRY_AFTER_SECONDS,
                       code="concurrency_limit_exceeded")


@contextmanager
def admitted(*, key: ApiKey, cost: int, room: Room) -> Iterator[Admission]:
    """Hold one of the key's organization's realtime slots, with `cost` nano-dollars
    reserved, for the block: 402 when the organization's credits or the key's budget
    cannot cover it beside what is unsettled and in flight, 503 past the unsettled cap,
    429 when no slot is free, 503 when Redis cannot be reached."""
    organization_id = key.organization_id
    token = uuid.uuid4().hex
    client = redis_client()
    keys = [slots_key(organization_id), reserved_key(organization_id),
            *metered_keys(organization_id, key.pk)]
    now = time.time()
    lifetime = slot_seconds()
    try:
        code, held = lua_script(client, _TAKE)(keys=[*keys, holding_key(organization_id)], args=[
            now, now + lifetime, settings.ANEX_REALTIME_CONCURRENCY, token, lifetime, cost,
            str(key.pk), room.organization, room.organization_settled,
            -1 if room.key is None else room.key, room.key_settled,
            nano(settings.ANEX_REALTIME_UNSETTLED_CAP_CREDITS)])
    except redis.RedisError as exc:
        logger.warning("realtime admission unavailable, request refused: %s", exc)
        raise Unavailable(LIMITER_UNAVAILABLE_DETAIL) from None
    if int(code) != 0:
        raise _refusal(int(code), int(held), key=key, cost=cost, room=room)
    admission = Admission()
    try:
        yield admission
    finally:
        try:
            lua_script(client, _GIVE_BACK)(keys=keys, args=[token, admission.spent])
        except redis.RedisError as exc:  # the slot and its reservation lapse on their own
            logger.warning("could not give back a realtime slot: %s", exc)


def slots_in_flight(*, organization_id: object) -> int:
    """The organization's slots not yet lapsed (for tests and the admin)."""
    key = slots_key(organization_id)
    return int(redis_client().zcount(key, time.time(), "+inf"))


def reservations_in_flight(*, organization_id: object) -> int:
    """The organization's reservations (for tests: none once its requests end)."""
    return int(redis_client().hlen(reserved_key(organization_id)))


@contextmanager
def concurrency_slot(*, key: ApiKey) -> Iterator[None]:
    """A slot with nothing reserved (another request in flight, for tests and tools)."""
    with admitted(key=key, cost=0, room=Room(organization=MOST_NANO, key=None,
                                             organization_settled=0, key_settled=0)):
        yield
