from __future__ import annotations

import logging

import stripe
from django.http import HttpRequest, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST

from billing.stripe_gateway import TopupUnavailable, webhook_event_handle, webhook_event_parse

logger = logging.getLogger(__name__)


@csrf_exempt
@require_POST
def stripe_webhook(request: HttpRequest) -> JsonResponse:
    """Stripe's deliveries. 2xx only for a verified event, so Stripe retries anything we
    could not take; crediting is idempotent per Checkout Session and debiting per refund
    total or dispute, so retries are safe."""
    try:
        event = webhook_event_parse(request.body, request.headers.get("Stripe-Signature"))
    except TopupUnavailable as exc:
        return JsonResponse({"detail": str(exc)}, status=404)
    except (ValueError, stripe.SignatureVerificationError):
        return JsonResponse({"detail": "Invalid Stripe signature or payload."}, status=400)
    return JsonResponse({"received": True, **webhook_event_handle(event)})
