"""What an answered realtime request bills, and how it reaches the ledger: the meter that
records each answered request (one INSERT, nothing locked), and the settlement that charges
a key's metered usage to the ledger in whole credits, carrying the fraction (the periodic
sweep, realtime.tasks)."""

from __future__ import annotations

import logging
import math
from datetime import datetime, timedelta
from decimal import Decimal

from django.conf import settings
from django.db import DatabaseError, connection, transaction
from django.db.models import F, Min
from django.utils import timezone
from redis import RedisError

from anex.errors import Unavailable
from anex.internals.prepared import PreparedInsert
from anex.requestid import current_request_id
from billing.services import organization_lock, realtime_charge_write
from billing.unsettled import NANO_PER_CREDIT
from console.models import ApiKey
from inference.catalog import CatalogModel
from inference.pricing import CENTS_PER_USD, Usage, usage_cost_usd
from realtime.concurrency import Admission, realtime_settled_add
from realtime.constants import Endpoint
from realtime.models import RealtimeSettlement, RealtimeUsage, RealtimeUsageDaily

logger = logging.getLogger(__name__)

UNBILLED_DETAIL = ("The answer could not be billed, so it is withheld and nothing was "
                   "charged. Retry.")
# Nano-dollars: the unit realtime money is reserved and metered in (realtime.concurrency).
NANO_PER_USD = NANO_PER_CREDIT * CENTS_PER_USD
PURGE_BATCH = 10_000
# A usage row is settled once it is this old (and marked settled as it is summed, so one
# that commits later than a younger row is simply the next settlement's).
SETTLE_MARGIN = timedelta(seconds=30)


def request_cost_nano(model: CatalogModel, input_tokens: int) -> int:
    """A request's cost in nano-dollars, rounded up (what is reserved and metered in
    Redis; the ledger is charged from the exact cost of its usage row)."""
    cost = usage_cost_usd(model, Usage(input_tokens=input_tokens), realtime=True)
    return math.ceil(cost * NANO_PER_USD)


def realtime_usage_record(*, key: ApiKey, endpoint: Endpoint, model: CatalogModel,
                          input_tokens: int) -> RealtimeUsage:
    """Meter one answered request at the model's realtime rate: one INSERT, nothing read or
    locked, so concurrent requests of one key never wait on each other. The ledger is
    charged from these rows by realtime_charges_settle."""
    request_id = current_request_id.get()
    return _USAGE_INSERT.create(
        organization_id=key.organization_id, api_key=key, endpoint=endpoint, model=model.id,
        input_tokens=input_tokens,
        cost_usd=usage_cost_usd(model, Usage(input_tokens=input_tokens), realtime=True),
        request_id="" if request_id == "-" else request_id)


# One per request: compiled once (anex.internals.prepared).
_USAGE_INSERT = PreparedInsert(RealtimeUsage)


def realtime_usage_bill(*, key: ApiKey, endpoint: Endpoint, model: CatalogModel,
                        input_tokens: int, admission: Admission) -> None:
    """Meter an answered request and count its cost as spent by its admission (given back
    to the organization's metered totals when the admission ends). An answer that cannot
    be metered is withheld (503): nothing is charged for it."""
    try:
        realtime_usage_record(key=key, endpoint=endpoint, model=model,
                              input_tokens=input_tokens)
    except DatabaseError as exc:
        logger.error("realtime: an answered request could not be metered: %s",
                     exc.__class__.__name__)
        raise Unavailable(UNBILLED_DETAIL) from None
    admission.spend(request_cost_nano(model, input_tokens))


# The settlement's one statement: the key's unsettled rows, marked settled as they are
# summed (so a row is charged once, whenever it commits), by day, endpoint and model for the
# roll-up; read through the partial index of unsettled rows (realtime_usage_unsettled).
_SETTLE_SQL = """
WITH settled AS (
    UPDATE realtime_realtimeusage SET settled = true
    WHERE api_key_id = %s AND NOT settled AND created_at < %s
    RETURNING id, endpoint, model, input_tokens, cost_usd, created_at
)
SELECT (created_at AT TIME ZONE 'UTC')::date, endpoint, model, count(*), sum(input_tokens),
       sum(cost_usd), sum(ceil(cost_usd * 1000000000)), max(id)
FROM settled GROUP BY 1, 2, 3
"""


def _carried_nano(metered_usd: Decimal, charged_cents: int) -> int:
    """What a key has metered and the ledger has not charged (the fraction carried)."""
    return math.ceil(metered_usd * NANO_PER_USD) - charged_cents * NANO_PER_CREDIT


@transaction.atomic
def realtime_charges_settle(*, key: ApiKey, settled_before: datetime | None = None) -> int:
    """Charge the ledger for the key's unsettled realtime usage, in whole credits; the
    credits charged now.

    The key's exact running total is carried from settlement to settlement and floored, so
    the ledger never charges ahead of use and the fractions are never lost. Only usage
    recorded before `settled_before` (default: SETTLE_MARGIN ago) is taken, and each row is
    marked settled in the statement that sums it, so a row that commits late is simply
    taken by the next settlement. Safe to run twice or at once: the organization lock
    orders settlements, a settled row is never summed again, and the charge's idempotency
    key makes a repeat write nothing. Once it commits, what it charged is added to the
    settled totals in Redis (realtime.concurrency), no longer held against new requests."""
    organization = organization_lock(key.organization_id)
    last = RealtimeSettlement.objects.filter(api_key=key).order_by("-id").first()
    cutoff = settled_before or timezone.now() - SETTLE_MARGIN
    with connection.cursor() as cursor:
        cursor.execute(_SETTLE_SQL, [key.pk, cutoff])
        groups = cursor.fetchall()
    if not groups:
        return 0
    for day, endpoint, model, requests, tokens, cost, _nano, _through in groups:
        daily, _ = RealtimeUsageDaily.objects.get_or_create(
            api_key=key, day=day, endpoint=endpoint, model=model,
            defaults={"organization": organization})
        RealtimeUsageDaily.objects.filter(pk=daily.pk).update(
            requests=F("requests") + requests, input_tokens=F("input_tokens") + tokens,
            cost_usd=F("cost_usd") + cost)
    before = last.metered_usd if last is not None else Decimal(0)
    metered = before + sum((group[5] for group in groups), Decimal(0))
    charged = last.charged_cents if last is not None else 0
    through = max(group[7] for group in groups)
    due = math.floor(metered * CENTS_PER_USD)
    RealtimeSettlement.objects.create(organization=organization, api_key=key,
                                      through_usage_id=through, metered_usd=metered,
                                      charged_cents=due)
    # What Redis counted for these rows (each rounded up) and the carry that stays unsettled.
    released = (sum(int(group[6]) for group in groups) + _carried_nano(before, charged)
                - _carried_nano(metered, due))
    transaction.on_commit(lambda: _settled_add(key=key, amount=released))
    if due <= charged:
        return 0
    realtime_charge_write(organization=organization, api_key=key, cents=due - charged,
                          through_cents=due,
                          reason=f"realtime usage of key {key.display} through request "
                                 f"{through}: {due} credits in all")
    return due - charged


def _settled_add(*, key: ApiKey, amount: int) -> None:
    try:
        realtime_settled_add(organization_id=key.organization_id, key_id=key.pk,
                             amount=amount)
    except RedisError as exc:  # the usage stays counted as unsettled: refusals too early
        logger.error("realtime: a settlement could not be counted in Redis: %s", exc)


def realtime_charges_settle_all(*, settled_before: datetime | None = None) -> int:
    """Settle every key with unsettled realtime usage (the sweep, on its own queue); the
    credits charged. Reads the unsettled rows alone, through their partial index."""
    cutoff = settled_before or timezone.now() - SETTLE_MARGIN
    keys = (RealtimeUsage.objects.filter(settled=False, created_at__lt=cutoff).order_by()
            .values_list("api_key_id", flat=True).distinct())
    charged = 0
    for key in ApiKey.objects.filter(pk__in=keys).select_related("organization"):
        charged += realtime_charges_settle(key=key, settled_before=cutoff)
    return charged


def realtime_usage_purge(*, before: datetime | None = None) -> int:
    """Delete settled usage rows older than ANEX_REALTIME_USAGE_RETENTION_DAYS (their sums
    live on in RealtimeUsageDaily), a batch at a time; the rows deleted. An unsettled row
    is never deleted."""
    cutoff = before or timezone.now() - timedelta(
        days=settings.ANEX_REALTIME_USAGE_RETENTION_DAYS)
    deleted = 0
    while True:
        batch = list(RealtimeUsage.objects.filter(settled=True, created_at__lt=cutoff)
                     .order_by().values_list("id", flat=True)[:PURGE_BATCH])
        if not batch:
            return deleted
        deleted += RealtimeUsage.objects.filter(pk__in=batch, settled=True).delete()[0]


def realtime_settlement_lag_seconds() -> float:
    """How long the oldest unsettled usage row has waited (0 with none): the settlement's
    lag, which stays under SETTLE_MARGIN plus the sweep's period while it keeps up."""
    oldest = (RealtimeUsage.objects.filter(settled=False).order_by()
              .aggregate(oldest=Min("created_at"))["oldest"])
    return 0.0 if oldest is None else max((timezone.now() - oldest).total_seconds(), 0.0)
