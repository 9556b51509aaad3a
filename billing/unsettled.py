"""Realtime spend the ledger has not charged yet, counted in Redis beside it: what approval
counts before it holds a job's estimate (billing.services.hold_place), and what a realtime
request counts before it spends (realtime.concurrency).

A realtime request is metered by one INSERT and charged to the ledger by the settlement,
30 to 60 seconds later (docs/dev/decisions/2026-12-01-realtime-counted-reserved-and-isolated.md).
Until then its money lives here, per organization and per key, in nano-dollars:

- metered: what answered requests cost (each adds its cost as it gives its slot back);
- settled: what settlements moved into the ledger (each adds it once it has committed);
- reserved: what each request in flight may cost, one hash field per request, lapsing with
  its slot (a member of the slots' sorted set, scored by when it lapses);
- holding: what each job approved in the last seconds holds, one hash field per approval,
  so that a realtime request whose process read the balance before the hold committed (a
  process keeps its read CREDITS_READ_EVERY_SECONDS) still counts it.

The organization's (or the key's) realtime spend not yet in the ledger is then
max(0, metered - settled) + reserved. Approval counts it (issue 40 M1: it read the ledger
alone, so a balance spent in realtime could be held again for a batch job a minute before
the settlement charged it) in one Lua call that, when the estimate is covered, writes the
job's holding mark: Redis runs it between two realtime admissions, never inside one, so
either the request's reservation is counted by the approval or the approval's mark by the
request. Approval itself does not count holding marks: it runs under the organization
lock, after every earlier approval has committed its hold to the ledger it has just read.

These names live in billing, below realtime, because approval reads them; realtime takes
its slots and reservations under the same names.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

import redis

from anex.redis import redis_client

# Money in Redis is counted in whole nano-dollars (a credit is 10,000,000 of them): exact
# for every realtime rate in the catalog, and in a Lua number (a double) up to $9M.
NANO_PER_CREDIT = 10_000_000
MOST_NANO = 2**53 - 1
# A realtime process keeps its read of a key's balance this long (realtime.services.admission).
CREDITS_READ_EVERY_SECONDS = 1.0
# How long an approval's holding mark is counted once its hold has committed: past every
# balance read a realtime process may still keep from before the commit, with a margin for
# the clocks of two machines (a mark lapses by the approving process's clock, a request
# compares it with its own).
HOLD_SEEN_SECONDS = CREDITS_READ_EVERY_SECONDS + 2.0
# How long it is counted before then: the rest of the approval's transaction. A mark whose
# approval rolls back is counted this long (realtime refused early, never an overdraft).
HOLD_PENDING_SECONDS = 60
NO_KEY = "-"

# Lua shared by approval's call and realtime's admission. in_flight sweeps the lapsed slots
# and their reservations and sums the rest, the organization's and the key's; unsettled is
# what one metered total has past its settled one; holding sums the marks not yet lapsed
# (sweeping the others). A reservation is "<nano> <key id>", a mark "<nano> <key id>
# <lapses at>".
LUA_FUNCTIONS = """
local function in_flight(slots, reserved, now, key_id)
  local expired = redis.call('ZRANGEBYSCORE', slots, '-inf', now)
  if #expired > 0 then
    redis.call('ZREMRANGEBYSCORE', slots, '-inf', now)
    redis.call('HDEL', reserved, unpack(expired))
  end
  local org, key = 0, 0
  local held = redis.call('HGETALL', reserved)
  for i = 1, #held, 2 do
    local space = string.find(held[i + 1], ' ', 1, true)
    local amount = tonumber(string.sub(held[i + 1], 1, space - 1))
    org = org + amount
    if string.sub(held[i + 1], space + 1) == key_id then
      key = key + amount
    end
  end
  return org, key
end
local function unsettled(metered, settled)
  return math.max(0, (tonumber(redis.call('GET', metered)) or 0)
                     - (tonumber(redis.call('GET', settled)) or 0))
end
local function holding(marks, now, key_id)
  local org, key = 0, 0
  local held = redis.call('HGETALL', marks)
  for i = 1, #held, 2 do
    local amount, mark_key, lapses = string.match(held[i + 1], '^(%d+) (%S+) (%S+)$')
    if tonumber(lapses) <= now then
      redis.call('HDEL', marks, held[i])
    else
      org = org + tonumber(amount)
      if mark_key == key_id then
        key = key + tonumber(amount)
      end
    end
  end
  return org, key
end
"""

# KEYS: the organization's slots, its reservations, its holding marks, its metered and
# settled totals, the key's metered and settled totals. ARGV: now, the organization's room,
# the key's room (-1: no budget), the estimate, the key's id (NO_KEY), the mark's field,
# when the mark lapses, the marks' lifetime. Answers {0 when the estimate is covered and
# the mark written, 1 when the organization's room does not cover it, 2 when the key's does
# not; what realtime holds against that room}.
_HOLD = LUA_FUNCTIONS + """
local now = tonumber(ARGV[1])
local estimate = tonumber(ARGV[4])
local org_reserved, key_reserved = in_flight(KEYS[1], KEYS[2], now, ARGV[5])
local org_held = unsettled(KEYS[4], KEYS[5]) + org_reserved
if org_held + estimate > tonumber(ARGV[2]) then
  return {1, org_held}
end
local key_room = tonumber(ARGV[3])
if key_room >= 0 then
  local key_held = unsettled(KEYS[6], KEYS[7]) + key_reserved
  if key_held + estimate > key_room then
    return {2, key_held}
  end
end
redis.call('HSET', KEYS[3], ARGV[6], ARGV[4] .. ' ' .. ARGV[5] .. ' ' .. ARGV[7])
redis.call('EXPIRE', KEYS[3], ARGV[8])
return {0, org_held}
"""
_scripts: dict[tuple[int, str], Any] = {}


def slots_key(organization_id: object) -> str:
    return f"anex:realtime:inflight:{organization_id}"


def reserved_key(organization_id: object) -> str:
    return f"anex:realtime:reserved:{organization_id}"


def holding_key(organization_id: object) -> str:
    return f"anex:realtime:holding:{organization_id}"


def metered_keys(organization_id: object, key_id: object) -> tuple[str, str]:
    return (f"anex:realtime:metered:org:{organization_id}",
            f"anex:realtime:metered:key:{key_id}")


def settled_keys(organization_id: object, key_id: object) -> tuple[str, str]:
    return (f"anex:realtime:settled:org:{organization_id}",
            f"anex:realtime:settled:key:{key_id}")


def nano(credits: int) -> int:
    return min(max(credits, 0) * NANO_PER_CREDIT, MOST_NANO)


def credits_text(amount: int) -> str:
    """Nano-dollars as credits, to two places (a realtime request costs a fraction of one)."""
    return f"{amount / NANO_PER_CREDIT:,.2f}"


def lua_script(client: redis.Redis, source: str) -> Any:
    """The client's registered script for `source` (EVALSHA, loaded once per client)."""
    script = _scripts.get((id(client), source))
    if script is None:
        script = _scripts[(id(client), source)] = client.register_script(source)
    return script


def _mark(job_id: object) -> str:
    return f"job:{job_id}"


def hold_mark(*, organization_id: uuid.UUID, key_id: object | None, job_id: object,
              estimate: int, room: int, key_room: int | None) -> tuple[int, int]:
    """Count the realtime spend not yet in the ledger against a job's estimate (credits),
    beside the room the ledger leaves the organization and the key (credits; None: the key
    has no budget, or there is no key), and when both cover it, mark the job's hold for
    the realtime requests of the next seconds. Answers (0, held), or (1, held) when the
    organization's room does not cover it, (2, held) when the key's does not, `held` being
    what realtime holds against that room (nano-dollars). Raises redis.RedisError."""
    key = str(key_id) if key_id is not None else NO_KEY
    metered_org, metered_key = metered_keys(organization_id, key)
    settled_org, settled_key = settled_keys(organization_id, key)
    now = time.time()
    client = redis_client()
    code, held = lua_script(client, _HOLD)(
        keys=[slots_key(organization_id), reserved_key(organization_id),
              holding_key(organization_id), metered_org, settled_org, metered_key,
              settled_key],
        args=[now, nano(room), -1 if key_room is None else nano(key_room), nano(estimate), key,
              _mark(job_id), now + HOLD_PENDING_SECONDS, HOLD_PENDING_SECONDS])
    return int(code), int(held)


def hold_mark_seen(*, organization_id: uuid.UUID, key_id: object | None, job_id: object,
                   estimate: int) -> None:
    """The job's hold has committed: its mark is counted HOLD_SEEN_SECONDS more, until no
    realtime process can still keep a balance read from before the commit. Raises
    redis.RedisError (the mark then lapses at its pending lifetime)."""
    key = str(key_id) if key_id is not None else NO_KEY
    lapses = time.time() + HOLD_SEEN_SECONDS
    marks = holding_key(organization_id)
    with redis_client().pipeline(transaction=False) as pipe:
        pipe.hset(marks, _mark(job_id), f"{nano(estimate)} {key} {lapses}")
        pipe.expire(marks, HOLD_PENDING_SECONDS)
        pipe.execute()
