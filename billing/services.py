"""Every write to the credit ledger, shared by the API, the console, the admin and the
workers (docs/dev/style.md rules 1, 4 and 5).

Locking: every function that reads a balance to decide a write locks the organization row
first (`organization_lock`), and callers that also lock a job lock the organization before
the job, always in that order. Each entry also carries a unique idempotency key, so even a
path that raced past the lock could not write the same movement twice.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Protocol

from django.db import IntegrityError, transaction
from django.db.models import F, Sum
from django.db.models.functions import Coalesce
from redis import RedisError

from anex.errors import PaymentRequired, Unavailable
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.unsettled import credits_text, hold_mark, hold_mark_seen
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction
from console.models import ApiKey, Organization

logger = logging.getLogger(__name__)

NO_CREDITS_DETAIL = (
    "The organization's credit balance is zero or below: add credits (a top-up on the "
    "console's Billing page) before uploading or submitting."
)
HOLD_UNAVAILABLE_DETAIL = (
    "The balance could not be read (the realtime usage not yet charged to it is counted "
    "apart, and could not be reached), so the approval was not made and nothing was held. "
    "Retry."
)


class HeldJob(Protocol):
    """What the ledger reads of the job it holds credits for (jobs.models.Job: billing sits
    below the jobs app and never imports it)."""

    @property
    def pk(self) -> Any: ...
    @property
    def organization_id(self) -> uuid.UUID: ...
    @property
    def est_cost_cents(self) -> int | None: ...
    @property
    def approved_by_key(self) -> ApiKey | None: ...


@dataclass(frozen=True)
class Credits:
    balance: int
    held: int

    @property
    def available(self) -> int:
        return self.balance - self.held

    def covers(self, cents: int) -> bool:
        """Whether `cents` may be spent now: the available balance (what approved jobs hold
        is not spendable) covers it. Approval asks it of the estimate; a realtime request,
        which has no approval, of the next credit it spends."""
        return cents <= self.available


@dataclass(frozen=True)
class KeyBudget:
    """A key's spend budget and what its approvals and realtime usage consumed of it."""

    budget: int
    spent: int

    @property
    def left(self) -> int:
        return self.budget - self.spent

    def covers(self, cents: int) -> bool:
        """Whether the key may spend `cents` more (approval: the estimate; a realtime
        request: the next credit)."""
        return cents <= self.left


def organization_lock(organization_id: uuid.UUID) -> Organization:
    """Lock the organization row for the rest of the transaction: the first lock taken by
    every path that moves its credits."""
    if not transaction.get_connection().in_atomic_block:
        raise RuntimeError("organization_lock needs a transaction")
    return Organization.objects.select_for_update().get(pk=organization_id)


def credits_summary(*, organization: Organization) -> Credits:
    totals = LedgerEntry.objects.for_org(organization).aggregate(
        balance=Coalesce(Sum("balance_delta"), 0), held=Coalesce(Sum("held_delta"), 0)
    )
    return Credits(balance=totals["balance"], held=totals["held"])


def credits_require_positive(*, organization: Organization) -> None:
    """The batch API's coarse check before uploads, ingests, submits and re-runs: any
    balance at all (402 otherwise), "a coarser check than approval's" (the reference).

    It differs from Credits.covers on purpose: nothing is spent until the job is approved,
    and approval asks the available balance (less what approved jobs hold) to cover the
    estimate, so holds are not counted here. A realtime request spends at once, with no
    approval after it, so realtime asks Credits.covers
    (docs/dev/decisions/2026-12-01-credits-and-billing.md)."""
    if credits_summary(organization=organization).balance <= 0:
        raise PaymentRequired(NO_CREDITS_DETAIL)


def _entry_write(**values: object) -> tuple[LedgerEntry, bool]:
    """Insert an entry, or return the one already written under its idempotency key."""
    key = values["idempotency_key"]
    existing = LedgerEntry.objects.filter(idempotency_key=key).first()
    if existing is not None:
        return existing, False
    try:
        with transaction.atomic():
            return LedgerEntry.objects.create(**values), True
    except IntegrityError:
        existing = LedgerEntry.objects.filter(idempotency_key=key).first()
        if existing is None:
            raise  # a constraint other than the key: a bug, not a repeat
        return existing, False


@transaction.atomic
def credits_grant(*, organization: Organization, cents: int, reason: str, actor: Actor,
                  idempotency_key: str | None = None) -> LedgerEntry:
    """Free credits: the new-organization grant, a CLI grant, a staff grant."""
    if cents <= 0:
        raise ValueError("a grant must be a positive number of credits")
    organization_lock(organization.pk)
    entry, created = _entry_write(
        organization=organization, kind=EntryKind.GRANT, balance_delta=cents,
        idempotency_key=idempotency_key or f"grant:{uuid.uuid4()}",
        staff_user=actor.user, reason=reason[:500],
    )
    if created:
        audit_record(organization=organization, actor=actor,
                     action=AuditAction.CREDITS_GRANTED, target=entry,
                     data={"cents": cents, "reason": reason})
    return entry


@transaction.atomic
def topup_record(*, organization_id: uuid.UUID, cents: int, checkout_session_id: str,
                 stripe_event_id: str, payment_intent: str = "") -> tuple[LedgerEntry, bool]:
    """Credit a paid Stripe Checkout Session, once however often Stripe redelivers (keyed
    by the session, so its completed and async_payment_succeeded events credit once)."""
    if cents <= 0:
        raise ValueError("a top-up must be a positive number of credits")
    organization = organization_lock(organization_id)
    entry, created = _entry_write(
        organization=organization, kind=EntryKind.TOPUP, balance_delta=cents,
        idempotency_key=f"stripe:checkout:{checkout_session_id}",
        stripe_event_id=stripe_event_id, stripe_payment_intent=payment_intent,
        reason=f"Stripe Checkout {checkout_session_id}",
    )
    if created:
        audit_record(organization=organization, actor=Actor(system="stripe"),
                     action=AuditAction.CREDITS_TOPPED_UP, target=entry,
                     data={"cents": cents, "checkout_session": checkout_session_id,
                           "event": stripe_event_id})
    return entry, created


def _topup_paid_by(payment_intent: str) -> LedgerEntry | None:
    """The top-up a PaymentIntent paid for, its organization locked; None when it is not one
    of ours (or predates recording it)."""
    if not payment_intent:
        return None
    topup = LedgerEntry.objects.filter(kind=EntryKind.TOPUP,
                                       stripe_payment_intent=payment_intent).first()
    if topup is not None:
        organization_lock(topup.organization_id)
    return topup


def _topup_reversal_write(*, topup: LedgerEntry, cents: int, idempotency_key: str,
                          reason: str, stripe_event_id: str,
                          action: AuditAction) -> tuple[LedgerEntry | None, bool]:
    """One adjustment against a top-up (its organization locked): negative `cents` takes
    back what Stripe reversed, positive gives back what a won dispute returned.

    Taking back is capped so a top-up is never reversed by more than it credited (a
    partial refund and then a dispute of the rest, or a redelivery of either, cannot
    overlap). The balance may go below zero: uploads, submits and approvals then answer
    402 until a top-up covers it (docs/dev/decisions/2026-12-01-credits-and-billing.md).
    """
    payment_intent = topup.stripe_payment_intent
    existing = LedgerEntry.objects.filter(idempotency_key=idempotency_key).first()
    if existing is not None:
        return existing, False
    if cents < 0:
        reversed_so_far = -int(LedgerEntry.objects.filter(
            kind=EntryKind.ADJUSTMENT, stripe_payment_intent=payment_intent,
        ).aggregate(total=Coalesce(Sum("balance_delta"), 0))["total"])
        cents = -min(-cents, topup.balance_delta - reversed_so_far)
    if cents == 0:
        return None, False
    organization = topup.organization
    entry, created = _entry_write(
        organization=organization, kind=EntryKind.ADJUSTMENT, balance_delta=cents,
        idempotency_key=idempotency_key, stripe_event_id=stripe_event_id,
        stripe_payment_intent=payment_intent, reason=reason[:500],
    )
    if created:
        audit_record(organization=organization, actor=Actor(system="stripe"), action=action,
                     target=entry, data={"cents": cents, "payment_intent": payment_intent,
                                         "event": stripe_event_id})
    return entry, created


@transaction.atomic
def topup_refund_record(*, payment_intent: str, charge_id: str, amount_refunded: int,
                        stripe_event_id: str) -> tuple[LedgerEntry | None, bool]:
    """Debit a refunded top-up. Stripe's `amount_refunded` is the charge's running total,
    so each delivery debits what that total adds to the refunds already debited, keyed by
    the total: a redelivery, or an older partial refund arriving late, debits nothing."""
    topup = _topup_paid_by(payment_intent)
    if topup is None or amount_refunded <= 0:
        return None, False
    # Read under the organization lock, so two deliveries cannot both debit one refund.
    refunded_so_far = -int(LedgerEntry.objects.filter(
        kind=EntryKind.ADJUSTMENT, idempotency_key__startswith=f"stripe:refund:{charge_id}:",
    ).aggregate(total=Coalesce(Sum("balance_delta"), 0))["total"])
    if amount_refunded <= refunded_so_far:
        return None, False
    return _topup_reversal_write(
        topup=topup, cents=-(amount_refunded - refunded_so_far),
        idempotency_key=f"stripe:refund:{charge_id}:{amount_refunded}",
        reason=f"Stripe refund of {charge_id}", stripe_event_id=stripe_event_id,
        action=AuditAction.CREDITS_REVERSED,
    )


@transaction.atomic
def topup_dispute_record(*, payment_intent: str, dispute_id: str, cents: int,
                         stripe_event_id: str) -> tuple[LedgerEntry | None, bool]:
    """Debit a disputed top-up when the dispute opens (Stripe withdraws the funds then),
    once per dispute."""
    topup = _topup_paid_by(payment_intent)
    if topup is None or cents <= 0:
        return None, False
    return _topup_reversal_write(
        topup=topup, cents=-cents,
        idempotency_key=f"stripe:dispute:{dispute_id}",
        reason=f"Stripe dispute {dispute_id}", stripe_event_id=stripe_event_id,
        action=AuditAction.CREDITS_REVERSED,
    )


@transaction.atomic
def topup_dispute_won_record(*, payment_intent: str, dispute_id: str,
                             stripe_event_id: str) -> tuple[LedgerEntry | None, bool]:
    """Give back exactly what a dispute debited once it is won, once."""
    topup = _topup_paid_by(payment_intent)
    debited = LedgerEntry.objects.filter(idempotency_key=f"stripe:dispute:{dispute_id}").first()
    if topup is None or debited is None:
        return None, False
    return _topup_reversal_write(
        topup=topup, cents=-debited.balance_delta,
        idempotency_key=f"stripe:dispute:{dispute_id}:won",
        reason=f"Stripe dispute {dispute_id} won", stripe_event_id=stripe_event_id,
        action=AuditAction.CREDITS_REINSTATED,
    )


def key_spend_cents(*, api_key: ApiKey) -> int:
    """What a key's approvals have consumed: open holds plus settled charges."""
    spent = LedgerEntry.objects.filter(
        api_key=api_key, kind__in=[EntryKind.HOLD, EntryKind.RELEASE, EntryKind.CHARGE]
    ).aggregate(spent=Coalesce(Sum(F("held_delta") - F("balance_delta")), 0))["spent"]
    return int(spent)


def key_budget(*, api_key: ApiKey) -> KeyBudget | None:
    """The key's spend budget and its spend so far; None for a key without a budget."""
    if api_key.spend_budget_cents is None:
        return None
    return KeyBudget(budget=api_key.spend_budget_cents, spent=key_spend_cents(api_key=api_key))


def hold_place(*, job: HeldJob) -> LedgerEntry | None:
    """Hold the job's estimate, inside the caller's transaction (job_approve's, which
    moves the job to in_progress in the same commit). 402 when it is not covered: by the
    ledger's available balance, or by it less the realtime spend the ledger has not charged
    yet (billing.unsettled); the same for the approving key's budget. 503 when that spend
    cannot be read."""
    organization = organization_lock(job.organization_id)
    existing = LedgerEntry.objects.filter(idempotency_key=f"job:{job.pk}:hold").first()
    if existing is not None:
        return existing
    estimate = job.est_cost_cents
    if estimate is None:
        raise ValueError("a job is approved on its estimate; this one has none")
    credits = credits_summary(organization=organization)
    if not credits.covers(estimate):
        raise PaymentRequired(
            f"The balance does not cover the estimate: approving this job holds {estimate} "
            f"credits and {max(credits.available, 0)} are available. Top up and approve "
            "again.",
        )
    key = job.approved_by_key
    budget = key_budget(api_key=key) if key is not None else None
    if budget is not None and not budget.covers(estimate):
        raise PaymentRequired(
            f"This API key's spend budget does not cover the estimate: approving this "
            f"job holds {estimate} credits and {max(budget.left, 0)} are left of its "
            f"{budget.budget}-credit budget.",
        )
    if estimate == 0:
        return None
    _realtime_require(job=job, key=key, estimate=estimate, credits=credits, budget=budget)
    entry, _ = _entry_write(
        organization=organization, kind=EntryKind.HOLD, held_delta=estimate, job_id=job.pk,
        api_key=key, idempotency_key=f"job:{job.pk}:hold",
    )
    return entry


def _realtime_require(*, job: HeldJob, key: ApiKey | None, estimate: int, credits: Credits,
                      budget: KeyBudget | None) -> None:
    """402 when the estimate is not covered beside the realtime spend the ledger has not
    charged yet (metered and not settled, and reserved by requests in flight), the
    organization's or the key's (issue 40 M1: otherwise a balance spent in realtime is held
    again for a job until the settlement charges it, 30 to 60 s later). Covered, the hold is
    marked for the realtime requests of the next seconds, whose processes may keep a
    balance read from before it commits. The organization is locked (hold_place), so the
    ledger just read and the spend read here are of one moment: a settlement, which
    locks it too, cannot move usage from one to the other in between."""
    organization_id = job.organization_id
    key_id = key.pk if key is not None else None
    try:
        code, held = hold_mark(organization_id=organization_id, key_id=key_id, job_id=job.pk,
                               estimate=estimate, room=credits.available,
                               key_room=budget.left if budget is not None else None)
    except RedisError as exc:
        logger.warning("approval: the realtime spend could not be read: %s", exc)
        raise Unavailable(HOLD_UNAVAILABLE_DETAIL) from None
    if code == 1:
        raise PaymentRequired(
            f"The balance does not cover the estimate: approving this job holds {estimate} "
            f"credits and {credits.available} are available, of which realtime usage not "
            f"yet charged and realtime requests in flight hold {credits_text(held)}. Top up "
            "and approve again.",
        )
    if code == 2:
        assert budget is not None
        raise PaymentRequired(
            f"This API key's spend budget does not cover the estimate: approving this job "
            f"holds {estimate} credits and {budget.left} are left of its {budget.budget}-"
            f"credit budget, of which its realtime usage not yet charged and its realtime "
            f"requests in flight hold {credits_text(held)}.",
        )

    def seen() -> None:
        try:
            hold_mark_seen(organization_id=organization_id, key_id=key_id, job_id=job.pk,
                           estimate=estimate)
        except RedisError as exc:  # the mark lapses on its own: realtime refused early
            logger.warning("approval: a hold's mark could not be shortened: %s", exc)

    transaction.on_commit(seen)


def hold_open_cents(*, job: HeldJob) -> int:
    total = LedgerEntry.objects.filter(job_id=job.pk).aggregate(held=Coalesce(Sum("held_delta"), 0))
    return int(total["held"])


@transaction.atomic
def hold_settle(*, job: HeldJob, cost_cents: int) -> int:
    """Charge the job's cost against its hold and release the rest; returns the charge.

    Runs on done, failed and cancelled alike. Settling twice changes nothing: the first
    settlement's charge is returned. A job never charges more than its hold.
    """
    if cost_cents < 0:
        raise ValueError("a cost is never negative")
    organization = organization_lock(job.organization_id)
    settled = LedgerEntry.objects.filter(
        job_id=job.pk, kind__in=[EntryKind.CHARGE, EntryKind.RELEASE]
    ).exists()
    if settled:
        return -int(LedgerEntry.objects.filter(job_id=job.pk, kind=EntryKind.CHARGE)
                    .aggregate(c=Coalesce(Sum("balance_delta"), 0))["c"])
    held = hold_open_cents(job=job)
    charge = min(cost_cents, held)
    if cost_cents > held:
        logger.error("job %s cost %s exceeds its hold %s; charging the hold",
                     job.pk, cost_cents, held)
    key = job.approved_by_key
    if charge > 0:
        _entry_write(organization=organization, kind=EntryKind.CHARGE, job_id=job.pk, api_key=key,
                     balance_delta=-charge, held_delta=-charge,
                     idempotency_key=f"job:{job.pk}:charge")
    if held - charge > 0:
        _entry_write(organization=organization, kind=EntryKind.RELEASE, job_id=job.pk, api_key=key,
                     held_delta=-(held - charge), idempotency_key=f"job:{job.pk}:release")
    return charge


def realtime_charge_write(*, organization: Organization, api_key: ApiKey, cents: int,
                          through_cents: int, reason: str) -> LedgerEntry:
    """Charge `cents` of a key's realtime usage, inside the caller's transaction with the
    organization already locked (realtime.services.settlement.realtime_charges_settle). Realtime
    usage is metered exactly and charged in whole credits as its running total passes
    them; `through_cents` is that total after this charge, unique per key, so a repeat
    writes nothing twice."""
    if cents <= 0:
        raise ValueError("a charge is a positive number of credits")
    entry, _ = _entry_write(
        organization=organization, kind=EntryKind.CHARGE, balance_delta=-cents,
        api_key=api_key, idempotency_key=f"realtime:{api_key.pk}:through:{through_cents}",
        reason=reason[:500],
    )
    return entry
