"""An organization's webhook endpoint, its signing secret and the test event: an owner's
settings (the console's Settings page, the admin, `createorg --webhook-url`), written here
beside the outbox that delivers to them (jobs.services.webhooks)."""

from __future__ import annotations

import math
import uuid
from datetime import timedelta
from typing import Any

from django.conf import settings
from django.core.exceptions import ValidationError
from django.db import transaction
from django.utils import timezone

from anex.crypto import secret_encrypt
from anex.errors import RateLimited
from anex.net import FetchError, url_mask
from anex.redis import window_hit
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction
from console.models import Organization
from console.services import actor_named, owner_require, owners_mail
from jobs.models import WebhookDelivery
from jobs.services.webhooks import (
    SECRET_GRACE,
    TEST_EVENT,
    organization_event_enqueue,
    webhook_secret_new,
    webhook_url_check,
)


def _webhook_owner_require(*, organization: Organization, actor: Actor) -> None:
    """The endpoint and its secret are an owner's (the reference: "an owner does this on
    the console's Settings page")."""
    owner_require(organization=organization, actor=actor,
                   message="Only an owner can change the webhook settings.")


def webhook_url_validate(url: str, *, organization_id: uuid.UUID) -> None:
    """webhook_url_check as a ValidationError, for a form field or a command's option."""
    try:
        webhook_url_check(url, organization_id=organization_id)
    except FetchError as exc:
        raise ValidationError(f"The webhook endpoint cannot be used: {exc}.",
                              code="webhook_url") from None


@transaction.atomic
def organization_webhook_set(*, organization: Organization, actor: Actor,
                             url: str) -> Organization:
    """Set (or, with "", remove) the endpoint every job event is POSTed to. It must be
    https and resolve only to public addresses (checked again at each delivery). The
    first endpoint gets a signing secret, shown to owners (console.selectors)."""
    _webhook_owner_require(organization=organization, actor=actor)
    url = url.strip()
    if url:
        webhook_url_validate(url, organization_id=organization.pk)
    locked = Organization.objects.select_for_update().get(pk=organization.pk)
    fields: dict[str, Any] = {}
    if url != locked.webhook_url:
        fields["webhook_url"] = url
    if url and not locked.webhook_secret_encrypted:
        fields["webhook_secret_encrypted"] = secret_encrypt(webhook_secret_new())
    if fields:
        Organization.objects.filter(pk=locked.pk).update(**fields)
    if "webhook_url" in fields:
        audit_record(organization=locked, actor=actor, action=AuditAction.WEBHOOK_ENDPOINT_SET,
                     target=locked,
                     data={"from": url_mask(locked.webhook_url), "to": url_mask(url)})
        # Every job event (with its result's links) goes to the endpoint: the owners hear
        # of a new one, masked as the audit log keeps it (issue 40 L1).
        owners_mail(organization=locked,
                    subject=f"The webhook endpoint of {locked.name} changed",
                    message=(f"{actor_named(actor)} changed where {locked.name}'s job events "
                             f"are sent, from {url_mask(locked.webhook_url) or '(none)'} to "
                             f"{url_mask(url) or '(none: events are no longer sent)'}."))
    organization.refresh_from_db()
    return organization


@transaction.atomic
def organization_webhook_secret_rotate(*, organization: Organization, actor: Actor,
                                       grace: bool = True) -> str:
    """A new signing secret; returns it. With grace the one it replaces keeps signing
    beside it for SECRET_GRACE, so events stay verifiable while the receiver switches;
    without (a secret that leaked) it is dropped at once, with any earlier one still in
    its grace period."""
    _webhook_owner_require(organization=organization, actor=actor)
    locked = Organization.objects.select_for_update().get(pk=organization.pk)
    secret = webhook_secret_new()
    kept = grace and bool(locked.webhook_secret_encrypted)
    Organization.objects.filter(pk=locked.pk).update(
        webhook_secret_encrypted=secret_encrypt(secret),
        webhook_secret_previous_encrypted=locked.webhook_secret_encrypted if kept else "",
        webhook_secret_previous_until=timezone.now() + SECRET_GRACE if kept else None,
    )
    # Never the secret itself: the audit log is readable by every member.
    audit_record(organization=locked, actor=actor, action=AuditAction.WEBHOOK_SECRET_ROTATED,
                 target=locked, data={"previous_valid_hours": (SECRET_GRACE / timedelta(hours=1)
                                                               if grace else 0)})
    organization.refresh_from_db()
    return secret


TESTS_LIMITED = ("Too many test events: an organization may send {limit} a minute. Nothing "
                 "was sent; try again in {seconds} seconds.")


@transaction.atomic
def organization_webhook_test(*, organization: Organization, actor: Actor) -> WebhookDelivery:
    """Queue the test event to the current endpoint (the Settings page's test button), at
    most ANEX_WEBHOOK_TESTS_PER_MINUTE a minute per organization: each is a delivery, with
    retries, to an address the owner chose. Fails closed when Redis is down (a 503 and
    nothing sent; docs/dev/decisions/2026-12-02-limiters-when-redis-fails.md)."""
    _webhook_owner_require(organization=organization, actor=actor)
    limit = settings.ANEX_WEBHOOK_TESTS_PER_MINUTE
    hit = window_hit("webhook-tests", organization.pk, fail="closed")
    if hit is not None and hit.count > limit:
        seconds = max(1, math.ceil(hit.seconds_left))
        raise RateLimited(TESTS_LIMITED.format(limit=limit, seconds=seconds),
                          retry_after=seconds)
    locked = Organization.objects.select_for_update().get(pk=organization.pk)
    if not locked.webhook_url:
        raise ValidationError("Set a webhook endpoint first.", code="webhook_url")
    delivery = organization_event_enqueue(organization=locked, event_type=TEST_EVENT)
    audit_record(organization=locked, actor=actor, action=AuditAction.WEBHOOK_TEST_SENT,
                 target=locked, data={"delivery_id": str(delivery.pk)})
    return delivery
