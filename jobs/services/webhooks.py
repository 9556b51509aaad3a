"""Signed webhook deliveries (Standard Webhooks), kept in an outbox until delivered.

Two kinds share the outbox: the organization's job events (and its test event), signed
with the organization's secret and sent to its current endpoint, and ingest callbacks,
signed with the ingest's own secret and sent to its callback_url (the reference,
"Webhooks" and "POST /inputs"). Each POST carries webhook-id, webhook-timestamp (unix
seconds) and webhook-signature, made by the `standardwebhooks` package. Only a 2xx counts
as delivered; anything else is retried on a widening backoff with jitter for about a day
(DELIVERY_BACKOFF_SECONDS), then given up. Deliveries go through the one SSRF-safe
fetcher: https only, every address public, redirects never followed.

At least once, in order per job: the row is written in the transaction that changes the
job and sent after commit, a lost message is re-sent by the sweeper, and a job's event is
not attempted while an earlier one of the same job is still pending.
"""

from __future__ import annotations

import base64
import json
import logging
import random
import secrets
import uuid
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import urlsplit

from django.db import transaction
from django.db.models import Exists, F, OuterRef, Q, QuerySet
from django.utils import timezone
from standardwebhooks import Webhook

from anex.crypto import secret_decrypt
from anex.net import FetchError, UnsafeURL, fetch, url_check, url_mask
from console.models import Organization
from jobs import dispatch
from jobs.constants import DELIVERY_BACKOFF_SECONDS, DeliveryStatus, JobStatus
from jobs.models import Input, Job, WebhookDelivery
from jobs.results import RESULT_LINK_SECONDS, result_download_url

logger = logging.getLogger(__name__)
SECRET_PREFIX = "whsec_"  # noqa: S105 - the format's prefix, not a secret
LEASE = timedelta(minutes=2)
# A rotated-out secret keeps signing beside the new one this long (both signatures in
# webhook-signature), so a receiver can switch to the new secret without dropping events.
SECRET_GRACE = timedelta(hours=24)
# The receiver's answer is all we wait for, and its body is never read: a short connect
# and a short read keep one slow endpoint from holding a worker (the actor's time limit
# is the backstop).
CONNECT_TIMEOUT_SECONDS = 5.0
READ_TIMEOUT_SECONDS = 10.0

# The event each job status sends (the reference, "Webhooks"); finalizing and cancelling
# send nothing.
JOB_EVENT_TYPES: dict[str, str] = {
    JobStatus.SUBMITTED: "submitted",
    JobStatus.ESTIMATING: "estimating",
    JobStatus.COST_READY: "cost_ready",
    JobStatus.IN_PROGRESS: "in_progress",
    JobStatus.DONE: "completed",
    JobStatus.FAILED: "failed",
    JobStatus.CANCELLED: "cancelled",
}
TEST_EVENT = "test"
_FINISHED_EVENTS = frozenset({"completed", "failed", "cancelled"})


def webhook_secret_new() -> str:
    return SECRET_PREFIX + base64.b64encode(secrets.token_bytes(24)).decode()


def webhook_url_check(url: str, *, organization_id: uuid.UUID) -> None:
    """Refuse an endpoint that is not https or not on the public internet; raises UnsafeURL
    (or another FetchError when the host does not resolve). Checked when an endpoint is
    set and again at each delivery, the lookup the organization's (anex.net)."""
    # Checked here, not only by the fetcher: tests let the fetcher use http on loopback.
    if urlsplit(url).scheme != "https":
        raise UnsafeURL("only https URLs are allowed")
    url_check(url, tenant=organization_id)


def webhook_signature(*, secrets_: list[str], msg_id: str, when: datetime,
                      body: bytes) -> str:
    """The webhook-signature header: one "v1,…" per secret, space-separated."""
    return " ".join(Webhook(secret).sign(msg_id, when, body.decode()) for secret in secrets_)


def _timestamp(*, unix: bool) -> int | str:
    now = timezone.now()
    # Ingest callbacks keep unix seconds; job events carry the reference's date string,
    # "2026-07-22T10:31:04.512+00:00".
    return int(now.timestamp()) if unix else now.isoformat(timespec="milliseconds")


def delivery_enqueue(*, organization: Organization, url: str, event_type: str,
                     data: dict[str, Any], input: Input | None = None,
                     job: Job | None = None) -> WebhookDelivery:
    """Record a delivery and send it once the caller's transaction commits. Its id is the
    event's id and the webhook-id of every attempt."""
    delivery_id = uuid.uuid4()
    delivery = WebhookDelivery.objects.create(
        id=delivery_id, organization=organization, input=input, job=job, url=url_mask(url),
        event_type=event_type, next_attempt_at=timezone.now(),
        payload={"type": event_type, "timestamp": _timestamp(unix=input is not None),
                 "id": f"msg_{delivery_id.hex}", "data": data},
    )
    _send_after_commit(delivery.pk, delay_seconds=0)
    return delivery


def job_webhook_enqueue(*, job: Job, status: str) -> WebhookDelivery | None:
    """Record the organization's webhook for a job that has just entered `status`, inside
    the caller's transaction (the outbox row is the durable record; it is sent after
    commit). Nothing for a state without an event (finalizing, cancelling) or for an
    organization without an endpoint. Called only by the job state machine
    (jobs/services/lifecycle.py, the one writer of Job.status)."""
    event_type = JOB_EVENT_TYPES.get(status)
    if event_type is None:
        return None
    organization = Organization.objects.get(pk=job.organization_id)
    if not organization.webhook_url:
        return None
    # The row as this transaction just wrote it, whatever the caller's instance holds.
    current = Job.objects.get(pk=job.pk)
    return delivery_enqueue(organization=organization, url=organization.webhook_url,
                            event_type=event_type, job=current,
                            data=_job_event_data(current, event_type, status))


def _job_event_data(job: Job, event_type: str, status: str) -> dict[str, Any]:
    data: dict[str, Any] = {"job_id": str(job.pk)}
    if event_type == "cost_ready":
        # The estimate is priced at the job's urgency tier: the tier is said beside it.
        data.update(est_input_tok=job.est_input_tok, est_output_tok=job.est_output_tok,
                    est_cost_cents=job.est_cost_cents, priority=job.priority)
    elif event_type == "completed":
        data["status"] = status  # result_url is added at each attempt (_payload_for_attempt)
    elif event_type in _FINISHED_EVENTS:
        data.update(status=status, partial=bool(job.partial))
        if job.failure_code or job.failure_reason:
            data.update(failure_code=job.failure_code or None,
                        failure_reason=job.failure_reason or None)
    return data


def organization_event_enqueue(*, organization: Organization,
                               event_type: str) -> WebhookDelivery:
    """An organization-level event (the Settings page's test event): no job, so its data
    is {"job_id": null}, the envelope every event shares."""
    return delivery_enqueue(organization=organization, url=organization.webhook_url,
                            event_type=event_type, data={"job_id": None})


def _send_after_commit(delivery_id: uuid.UUID, *, delay_seconds: float) -> None:
    dispatch.send_on_commit("delivery_attempt_task", str(delivery_id),
                            delay_ms=int(delay_seconds * 1000))


def organization_signing_secrets(organization: Organization) -> list[str]:
    """The secrets that sign the organization's events now: the current one, and the one
    it replaced while that is inside its grace period."""
    found = [secret_decrypt(organization.webhook_secret_encrypted)] \
        if organization.webhook_secret_encrypted else []
    until = organization.webhook_secret_previous_until
    if organization.webhook_secret_previous_encrypted and until and until > timezone.now():
        found.append(secret_decrypt(organization.webhook_secret_previous_encrypted))
    return found


def _signing_secrets(delivery: WebhookDelivery) -> list[str]:
    if delivery.input is not None:
        return [secret_decrypt(delivery.input.callback_secret_encrypted)]
    found = organization_signing_secrets(delivery.organization)
    if not found:
        raise ValueError(f"delivery {delivery.pk} has no signing secret")
    return found


def _destination(delivery: WebhookDelivery) -> str:
    # An organization's events go to its endpoint as it is now, so fixing a broken URL in
    # Settings also reaches the retries already waiting.
    # The row keeps the URL masked (anex.net.url_mask): an ingest's callback goes to the
    # URL its input holds.
    return delivery.input.callback_url if delivery.input is not None \
        else delivery.organization.webhook_url


def _payload_for_attempt(delivery: WebhookDelivery) -> dict[str, Any]:
    """The stored event, plus a result link made now: it is presigned and expires, so a
    retry a day later must still carry a working one (the id stays the same)."""
    payload = dict(delivery.payload)
    if delivery.job is None or delivery.event_type not in _FINISHED_EVENTS:
        return payload
    data = dict(payload["data"])
    link = _result_link(delivery.job)
    if link is not None:
        data.update(result_url=link[0], result_expires_in=link[1])
    elif delivery.event_type == "completed":
        data.update(result_url=None, result_expires_in=None)  # its data was deleted since
    payload["data"] = data
    return payload


def _result_link(job: Job) -> tuple[str, int] | None:
    url = result_download_url(job)
    return None if url is None else (url, RESULT_LINK_SECONDS)


def _earlier_of_same_job_pending() -> Exists:
    """A pending delivery of the same job recorded before this one: it goes first."""
    return Exists(WebhookDelivery.objects.filter(
        Q(created_at__lt=OuterRef("created_at"))
        | Q(created_at=OuterRef("created_at"), id__lt=OuterRef("id")),
        job_id=OuterRef("job_id"), status=DeliveryStatus.PENDING,
    ))


def _due(now: datetime) -> QuerySet[WebhookDelivery]:
    return WebhookDelivery.objects.filter(
        Q(leased_until__isnull=True) | Q(leased_until__lt=now),
        status=DeliveryStatus.PENDING, next_attempt_at__lte=now,
    ).exclude(_earlier_of_same_job_pending())


def delivery_attempt(*, delivery_id: uuid.UUID | str) -> DeliveryStatus | None:
    """One attempt, by whichever worker claims it first; None when none was due (not yet,
    already settled, leased by another worker, or waiting behind an earlier event of its
    job, which sends it when it settles)."""
    claimed = _due(timezone.now()).filter(pk=delivery_id).update(
        leased_until=timezone.now() + LEASE, attempts=F("attempts") + 1)
    if claimed != 1:
        return None
    delivery = WebhookDelivery.objects.select_related("input", "organization", "job").get(
        pk=delivery_id)
    url = _destination(delivery)
    if not url:
        # The organization removed its endpoint: there is nowhere to deliver to.
        return _settle(delivery, DeliveryStatus.GAVE_UP, url=delivery.url, status_code=None,
                       error="the organization has no webhook endpoint")
    status_code: int | None = None
    error = ""
    try:
        webhook_url_check(url, organization_id=delivery.organization_id)
        body = json.dumps(_payload_for_attempt(delivery), separators=(",", ":")).encode()
        msg_id = delivery.payload["id"]
        when = timezone.now()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "anex-webhooks/1",
            "webhook-id": msg_id,
            "webhook-timestamp": str(int(when.timestamp())),
            "webhook-signature": webhook_signature(secrets_=_signing_secrets(delivery),
                                                   msg_id=msg_id, when=when, body=body),
        }
        # Redirects are never followed (max_redirects=0): a 3xx is a failed attempt.
        with fetch("POST", url, tenant=delivery.organization_id, headers=headers, body=body,
                   max_bytes=64 * 1024,
                   connect_timeout=CONNECT_TIMEOUT_SECONDS,
                   read_timeout=READ_TIMEOUT_SECONDS) as response:
            status_code = response.status
    except FetchError as exc:
        error = str(exc)
    if status_code is not None and 200 <= status_code < 300:
        return _settle(delivery, DeliveryStatus.DELIVERED, url=url, status_code=status_code)
    error = error or f"HTTP {status_code}"
    if delivery.attempts > len(DELIVERY_BACKOFF_SECONDS):
        logger.info("webhook %s given up after %s attempts", delivery.pk, delivery.attempts)
        return _settle(delivery, DeliveryStatus.GAVE_UP, url=url, status_code=status_code,
                       error=error)
    # Jitter spreads retries out so a recovering endpoint is not hit by all at once.
    delay = DELIVERY_BACKOFF_SECONDS[delivery.attempts - 1] * random.uniform(0.9, 1.1)  # noqa: S311
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            next_attempt_at=timezone.now() + timedelta(seconds=delay), leased_until=None,
            url=url_mask(url), last_status_code=status_code, last_error=error[:500])
        _send_after_commit(delivery.pk, delay_seconds=delay)
    return DeliveryStatus.PENDING


def _settle(delivery: WebhookDelivery, outcome: DeliveryStatus, *, url: str,
            status_code: int | None, error: str = "") -> DeliveryStatus:
    with transaction.atomic():
        WebhookDelivery.objects.filter(pk=delivery.pk).update(
            status=outcome, leased_until=None, url=url_mask(url), last_status_code=status_code,
            last_error=error[:500],
            delivered_at=timezone.now() if outcome == DeliveryStatus.DELIVERED else None)
        if delivery.job_id is not None:
            job_id = delivery.job_id
            transaction.on_commit(lambda: _job_next_send(job_id))
    return outcome


def _job_next_send(job_id: uuid.UUID) -> None:
    """Send the job's next pending event, which waited for the one just settled. Run after
    that commit, so a next event committed meanwhile is seen here or sees it settled."""
    following = WebhookDelivery.objects.filter(
        job_id=job_id, status=DeliveryStatus.PENDING).order_by("created_at", "id").first()
    if following is not None:
        wait = (following.next_attempt_at - timezone.now()).total_seconds()
        dispatch.send("delivery_attempt_task", str(following.pk),
                      delay_ms=max(0, int(wait * 1000)))


def deliveries_sweep() -> int:
    """Re-send deliveries that are due but whose queue message was lost (a process that
    died between commit and send, a broker restart, a worker killed mid-attempt once its
    lease ran out). Attempts are claimed, so a duplicate message is harmless; an event
    waiting behind an earlier one of its job is left to that one."""
    due = _due(timezone.now() - timedelta(seconds=30)).values_list("pk", flat=True)[:500]
    count = 0
    for delivery_id in due:
        dispatch.send("delivery_attempt_task", str(delivery_id))
        count += 1
    return count
