"""Whether a realtime request may be answered, judged before any engine reads it: the
operator's switch (503), the residency rules (403, 421), this process's realtime places
(503), the credits and the key's spend budget (402, or 503 when they cannot be read), and
the reservation of its counted cost with the organization's concurrency (realtime.
concurrency: 402, 503, 429)."""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from django.conf import settings
from django.contrib.auth.models import User
from django.db import DatabaseError
from django.utils import timezone
from redis import RedisError

from anex.errors import PaymentRequired, Unavailable
from anex.regions import Region, eu_routing_require, organization_region, region_check
from billing.services import credits_summary, key_budget
from billing.unsettled import CREDITS_READ_EVERY_SECONDS
from console.models import ApiKey
from inference.catalog import CatalogModel
from realtime.concurrency import (
    LIMITER_UNAVAILABLE_DETAIL,
    Admission,
    Room,
    admitted,
    nano,
    settled_read,
)
from realtime.constants import SWITCH_ID
from realtime.models import RealtimeSwitch
from realtime.selectors import realtime_frozen, realtime_frozen_forget
from realtime.services.settlement import request_cost_nano

logger = logging.getLogger(__name__)

FROZEN_DETAIL = ("The realtime API is paused for maintenance, so nothing was done. Retry "
                 "after the seconds in the Retry-After header.")
BILLING_UNAVAILABLE_DETAIL = ("The credit balance could not be read, so nothing was done "
                              "and nothing was billed. Retry.")
NO_CREDITS_DETAIL = ("The organization has no credits left: add credits (a top-up on the "
                     "console's Billing page) before sending realtime requests.")
PROCESS_FULL_DETAIL = ("This server is answering as many realtime requests as it may at once, "
                       "so nothing was done and nothing was billed. Retry after the seconds "
                       "in the Retry-After header.")
_in_process = 0  # this process's realtime requests in flight (realtime_place_take)
_in_process_lock = threading.Lock()
# A request spends a fraction of a credit and the ledger charges whole ones, so the credits
# and the key's budget must cover the next whole credit (billing.services Credits.covers,
# KeyBudget.covers: approval's rules, asked of the smallest spend).
NEXT_CREDIT = 1
# The credit check's answer for a key is kept CREDITS_READ_EVERY_SECONDS per process
# (_credits_require; an approval's mark is counted that long after its hold commits).
CREDITS_READ_KEYS = 10_000
_credits_read: dict[uuid.UUID, tuple[float, str | None, Room]] = {}


# -- the switch ----------------------------------------------------------------------------

def realtime_switch_set(*, frozen: bool, reason: str = "", user: User | None) -> RealtimeSwitch:
    """Freeze or reopen the realtime API (the admin's switch)."""
    switch, _ = RealtimeSwitch.objects.update_or_create(
        pk=SWITCH_ID, defaults={"frozen": frozen, "reason": reason[:500],
                                "changed_at": timezone.now(), "changed_by": user})
    realtime_frozen_forget()  # this process at once; the others within a second
    logger.warning("realtime API %s by %s", "frozen" if frozen else "reopened",
                   user.get_username() if user else "the system")
    return switch


def realtime_open_require() -> None:
    if realtime_frozen():
        raise Unavailable(FROZEN_DETAIL)


# -- the region ----------------------------------------------------------------------------

def region_require(*, key: ApiKey, host_region: Region) -> None:
    """The batch API's residency rules for a request that stores nothing: the EU host only
    for an organization with EU data routing (403), and such an organization's texts only on
    the EU host (421, naming it), so they are processed in the region its data lives in."""
    organization = key.organization
    if host_region == Region.EU:
        eu_routing_require(organization)
    region_check(host_region=host_region, residency=organization_region(organization),
                 noun="organization's data")


# -- this process's places -----------------------------------------------------------------

def realtime_place_take() -> None:
    """Take one of this web process's realtime places, or 503: past
    ANEX_REALTIME_PROCESS_CONCURRENCY requests in flight (fewer than its threads), so
    requests on a slow engine never hold every thread and the batch API, the console and
    /healthz keep being answered. Taken by the view before anything else is read (the key,
    the rate, the body, the tokens), so a refusal costs next to nothing; given back by
    realtime_place_give, whatever the answer."""
    global _in_process
    with _in_process_lock:
        if _in_process >= settings.ANEX_REALTIME_PROCESS_CONCURRENCY:
            raise Unavailable(PROCESS_FULL_DETAIL, retry_after=1)
        _in_process += 1


def realtime_place_give() -> None:
    global _in_process
    with _in_process_lock:
        _in_process -= 1


# -- the credits and the reservation -------------------------------------------------------

def _credits_refusal(*, key: ApiKey) -> tuple[str | None, Room]:
    """Why the organization or the key may not spend (402), or None, and what they may
    spend; 503 when the ledger (or the settled totals beside it) cannot be read."""
    try:
        # The settled totals first: a settlement landing between the two reads is then
        # counted twice (one refusal too many), never not at all (realtime.concurrency).
        org_settled, key_settled = settled_read(key=key)
    except RedisError as exc:
        logger.warning("realtime: the settled totals could not be read: %s", exc)
        raise Unavailable(LIMITER_UNAVAILABLE_DETAIL) from None
    try:
        credits = credits_summary(organization=key.organization)
        budget = key_budget(api_key=key)
    except DatabaseError as exc:
        logger.warning("realtime: the balance could not be read: %s", exc.__class__.__name__)
        raise Unavailable(BILLING_UNAVAILABLE_DETAIL) from None
    room = Room(organization=nano(credits.available),
                key=None if budget is None else nano(budget.budget - budget.spent),
                organization_settled=org_settled, key_settled=key_settled)
    if not credits.covers(NEXT_CREDIT):
        return NO_CREDITS_DETAIL, room
    if budget is not None and not budget.covers(NEXT_CREDIT):
        return (f"This API key's spend budget is used up: it has spent {budget.spent} of its "
                f"{budget.budget}-credit budget. Raise the budget on the console's Keys page, "
                "or use another key."), room
    return None, room


def _credits_require(*, key: ApiKey) -> Room:
    """402 when the organization has nothing left to spend (its balance less what approved
    jobs hold) or the key's spend budget is used up; else what they may spend, which the
    request's reservation is checked against (realtime.concurrency). Each process keeps
    the answer for a key CREDITS_READ_EVERY_SECONDS, so most requests skip the ledger's sums
    (a query, and a fifth of a request's CPU): what realtime spends meanwhile is counted in
    Redis, beside it, until the settlement charges it."""
    now = time.monotonic()
    read = _credits_read.get(key.pk)
    if read is None or now - read[0] >= CREDITS_READ_EVERY_SECONDS:
        if len(_credits_read) > CREDITS_READ_KEYS:
            _credits_read.clear()
        read = _credits_read[key.pk] = (now, *_credits_refusal(key=key))
    if read[1] is not None:
        raise PaymentRequired(read[1])
    return read[2]


def realtime_credits_forget() -> None:
    """Read every key's balance afresh on its next request (tests; a process's own top-up)."""
    _credits_read.clear()


@dataclass(frozen=True)
class Counted:
    """A request's input tokens, counted by the web tier before any engine reads it:
    `exact` with the model's own tokenizer (None where this process has none), `most`
    the most the engine can bill (what is reserved), `taken` what a request the engine
    took and did not answer in time is billed (the exact count, or without a tokenizer a
    byte count: an upper bound on any tokenizer's count of a text)."""

    exact: int | None
    most: int
    taken: int


@contextmanager
def request_admitted(*, key: ApiKey, model: CatalogModel, counted: Counted
                     ) -> Iterator[Admission]:
    """The request admitted for the most it can bill: the credits and the key's budget
    (402), then its reservation and a concurrency slot, held while the block runs."""
    room = _credits_require(key=key)
    with admitted(key=key, cost=request_cost_nano(model, counted.most),
                  room=room) as admission:
        yield admission
