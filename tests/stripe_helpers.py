"""Stripe's webhook signing scheme, done the documented way, for tests: the signed payload
is "{timestamp}.{body}", HMAC-SHA256 with the endpoint secret, sent as
Stripe-Signature: t=<timestamp>,v1=<hex digest>."""

from __future__ import annotations

import hashlib
import hmac
import uuid
from typing import Any

from console.models import Organization

WEBHOOK_SECRET = "whsec_test_" + "s" * 24


def signed_headers(payload: bytes, *, timestamp: int,
                   secret: str = WEBHOOK_SECRET) -> dict[str, str]:
    signed = f"{timestamp}.".encode() + payload
    digest = hmac.new(secret.encode(), signed, hashlib.sha256).hexdigest()
    return {"Stripe-Signature": f"t={timestamp},v1={digest}"}


def checkout_completed_event(organization: Organization, *, cents: int,
                             event_type: str = "checkout.session.completed",
                             session_id: str = "cs_test_1", payment_status: str = "paid",
                             currency: str = "usd") -> dict[str, Any]:
    return {
        "id": f"evt_{uuid.uuid4().hex}",
        "object": "event",
        "type": event_type,
        "api_version": "2025-01-01",
        "created": 1_700_000_000,
        "livemode": False,
        "data": {"object": {
            "id": session_id,
            "object": "checkout.session",
            "mode": "payment",
            "payment_status": payment_status,
            "currency": currency,
            "amount_total": cents,
            "client_reference_id": str(organization.pk),
            "metadata": {"organization_id": str(organization.pk), "credits_cents": str(cents)},
        }},
    }
