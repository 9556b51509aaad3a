"""Stripe Checkout top-ups: creating a session, and reading the webhook events it sends.

The ledger write itself is billing.services.topup_record; this module only talks to
Stripe. With no STRIPE_SECRET_KEY configured, top-ups are unavailable and say so.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import stripe
from django.conf import settings

from billing.constants import TOPUP_MAX_CENTS, TOPUP_MIN_CENTS
from billing.services import (
    topup_dispute_record,
    topup_dispute_won_record,
    topup_record,
    topup_refund_record,
)
from console.models import Organization

logger = logging.getLogger(__name__)

# Both mean "the customer's money arrived": card payments complete paid, delayed methods
# (bank debits) complete unpaid and succeed later.
PAID_EVENTS = ("checkout.session.completed", "checkout.session.async_payment_succeeded")
# Money Stripe takes back from a paid top-up (and gives back when a dispute is won).
REVERSAL_EVENTS = ("charge.refunded", "charge.dispute.created", "charge.dispute.closed")


class TopupUnavailable(Exception):
    """Stripe is not configured in this deployment."""


def topup_available() -> bool:
    return bool(settings.STRIPE_SECRET_KEY)


def _client() -> stripe.StripeClient:
    if not settings.STRIPE_SECRET_KEY:
        raise TopupUnavailable("Top-ups are unavailable: Stripe is not configured.")
    base = {"api": settings.STRIPE_API_BASE} if settings.STRIPE_API_BASE else None
    return stripe.StripeClient(settings.STRIPE_SECRET_KEY, base_addresses=base,  # type: ignore[arg-type]
                               max_network_retries=2)


def checkout_session_create(*, organization: Organization, cents: int, success_url: str,
                            cancel_url: str) -> str:
    """A Checkout Session that buys `cents` credits; returns the URL to send the owner to."""
    if not TOPUP_MIN_CENTS <= cents <= TOPUP_MAX_CENTS:
        raise ValueError(
            f"A top-up is between ${TOPUP_MIN_CENTS / 100:,.2f} and ${TOPUP_MAX_CENTS / 100:,.2f}."
        )
    session = _client().v1.checkout.sessions.create(
        params={
            "mode": "payment",
            "line_items": [{
                "quantity": 1,
                "price_data": {
                    "currency": "usd",
                    "unit_amount": cents,
                    "product_data": {"name": "anex credits",
                                     "description": f"{cents:,} credits for {organization.name}"},
                },
            }],
            "client_reference_id": str(organization.pk),
            "metadata": {"organization_id": str(organization.pk), "credits_cents": str(cents)},
            "success_url": success_url,
            "cancel_url": cancel_url,
        },
        options={"idempotency_key": f"topup-{uuid.uuid4()}"},
    )
    if not session.url:
        raise stripe.StripeError("Stripe returned a Checkout Session without a URL")
    return session.url


def webhook_event_parse(payload: bytes, signature: str | None) -> stripe.Event:
    """Verify the Stripe-Signature header against the webhook secret (the stripe library's
    own check, with its timestamp tolerance) and parse the event.

    Raises stripe.SignatureVerificationError or ValueError for anything not from Stripe.
    """
    if not settings.STRIPE_WEBHOOK_SECRET:
        raise TopupUnavailable("Stripe webhooks are not configured.")
    return stripe.Webhook.construct_event(payload, signature, settings.STRIPE_WEBHOOK_SECRET)


def webhook_event_handle(event: stripe.Event) -> dict[str, bool]:
    """Credit a paid top-up, debit a refunded or disputed one. Says whether this delivery
    credited (a top-up, a won dispute) or debited (a refund, a dispute) the ledger."""
    if event.type in REVERSAL_EVENTS:
        return _reversal_handle(event)
    return {"credited": _topup_handle(event)}


def _topup_handle(event: stripe.Event) -> bool:
    if event.type not in PAID_EVENTS:
        return False
    session: dict[str, Any] = event.data.object.to_dict()
    if session.get("mode") != "payment" or session.get("payment_status") != "paid":
        return False
    if session.get("currency") != "usd":
        logger.error("stripe session %s paid in %s, not usd; not credited",
                     session.get("id"), session.get("currency"))
        return False
    metadata = session.get("metadata") or {}
    raw_org = metadata.get("organization_id") or session.get("client_reference_id")
    try:
        organization_id = uuid.UUID(str(raw_org))
    except ValueError:
        logger.error("stripe session %s names no organization", session.get("id"))
        return False
    if not Organization.objects.filter(pk=organization_id).exists():
        logger.error("stripe session %s names unknown organization %s",
                     session.get("id"), organization_id)
        return False
    amount = session.get("amount_total")
    # A fully discounted or malformed session pays nothing: acknowledged (Stripe would
    # otherwise retry it for days), credited nothing.
    if not isinstance(amount, int) or isinstance(amount, bool) or amount <= 0:
        logger.error("stripe session %s paid amount_total %r; not credited",
                     session.get("id"), amount)
        return False
    _entry, created = topup_record(
        organization_id=organization_id, cents=amount,
        checkout_session_id=str(session["id"]), stripe_event_id=str(event.id),
        payment_intent=_object_id(session.get("payment_intent")),
    )
    return created


def _object_id(value: Any) -> str:
    """An id Stripe sends as a string, or inside the object when it was expanded."""
    if isinstance(value, dict):
        value = value.get("id")
    return value if isinstance(value, str) else ""


def _reversal_handle(event: stripe.Event) -> dict[str, bool]:
    """A refund or dispute of a top-up's charge. Found by the top-up's PaymentIntent; a
    charge that paid no top-up of ours (or is not in usd) changes nothing."""
    obj: dict[str, Any] = event.data.object.to_dict()
    payment_intent = _object_id(obj.get("payment_intent"))
    amount = obj.get("amount_refunded" if event.type == "charge.refunded" else "amount")
    if obj.get("currency") != "usd" or not isinstance(amount, int) or not payment_intent:
        logger.error("stripe %s %s: no usd amount or payment intent; nothing debited",
                     event.type, obj.get("id"))
        return {"debited": False}
    if event.type == "charge.refunded":
        entry, created = topup_refund_record(
            payment_intent=payment_intent, charge_id=str(obj["id"]), amount_refunded=amount,
            stripe_event_id=str(event.id))
    elif event.type == "charge.dispute.created":
        entry, created = topup_dispute_record(
            payment_intent=payment_intent, dispute_id=str(obj["id"]), cents=amount,
            stripe_event_id=str(event.id))
    else:
        if obj.get("status") != "won":
            return {"credited": False}
        _won, created = topup_dispute_won_record(
            payment_intent=payment_intent, dispute_id=str(obj["id"]),
            stripe_event_id=str(event.id))
        return {"credited": created}
    if entry is None:
        logger.warning("stripe %s %s: no top-up of ours left to reverse for %s",
                       event.type, obj.get("id"), payment_intent)
    return {"debited": created}
