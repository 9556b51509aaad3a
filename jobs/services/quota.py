"""The stored-input quota of an organization (issue 40 M4;
docs/dev/decisions/2026-12-06-stored-inputs-a-quota-per-organization.md).

An input (an upload, an ingest, an OpenAI file, a re-run's rows) is kept 7 days whatever it
costs to keep, so an organization keeps at most so many inputs, and so many bytes of them,
at once: the deployment's ANEX_STORED_INPUTS_MAX and ANEX_STORED_INPUT_BYTES_MAX, or its own
(Organization.stored_inputs_max / stored_input_bytes_max, set by staff in the admin).

An input counts from its creation until its object is deleted (its expiry, DELETE
/batch/v1/jobs/{id}/data, DELETE /openai/v1/files/{id}). One whose file has not landed
(an open upload target, an ingest copying, or a failed upload whose form could still be
replayed to S3) counts as the input cap, the most it may receive, so the bytes stored never
pass the quota even before the upload is settled. Checked when an input is created and
again, on the stored object's real size, when its file lands: that check runs under the
organization lock, so concurrent completions cannot overshoot together.
"""

from __future__ import annotations

import math
import uuid
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db.models import Count, Min, Q, Sum
from django.db.models.functions import Coalesce
from django.utils import timezone

from anex.errors import QuotaExceeded
from console.models import Organization
from jobs.constants import InputStatus
from jobs.models import Input

# Not landed yet: counted at the input cap.
LANDING = (InputStatus.AWAITING_UPLOAD, InputStatus.PENDING, InputStatus.COPYING)
# Retry-After when no stored input has a deadline (only ingests still copying).
RETRY_AFTER_SECONDS = 60
FREE_SPACE = ("Delete inputs you no longer need - DELETE /batch/v1/jobs/{id}/data deletes "
              "a job's input with its data, DELETE /openai/v1/files/{id} an uploaded "
              "file - or wait for some to expire (an input is kept 7 days).")


@dataclass(frozen=True)
class StoredQuota:
    inputs: int
    bytes: int


@dataclass(frozen=True)
class StoredUsage:
    """What counts against an organization's quota now."""

    inputs: int  # kept, landed or not
    landed_bytes: int  # the landed ones' sizes
    landing: int  # not landed: each counted as the input cap
    freed_at: datetime | None  # when the soonest of them expires by itself

    @property
    def bytes(self) -> int:
        return self.landed_bytes + self.landing * settings.ANEX_INPUT_MAX_BYTES


def stored_quota(organization: Organization) -> StoredQuota:
    """The organization's own quota where staff set one, else the deployment's."""
    inputs, size = organization.stored_inputs_max, organization.stored_input_bytes_max
    return StoredQuota(inputs=settings.ANEX_STORED_INPUTS_MAX if inputs is None else inputs,
                       bytes=settings.ANEX_STORED_INPUT_BYTES_MAX if size is None else size)


def stored_usage(*, organization: Organization,
                 excluding: uuid.UUID | None = None) -> StoredUsage:
    """The organization's kept inputs, in one query (`excluding` one of them: the input
    being settled, counted by its caller at its real size)."""
    now = timezone.now()
    landing = Q(status__in=LANDING) | Q(status=InputStatus.FAILED, upload_expires_at__gt=now)
    landed = Q(status__in=[InputStatus.READY, InputStatus.EXPIRED])
    kept = Input.objects.filter(organization=organization, deleted_at__isnull=True) \
        .filter(landing | landed)
    if excluding is not None:
        kept = kept.exclude(pk=excluding)
    # An input kept past its deadline (a job still reads it) frees nothing by waiting.
    pending = Q(expires_at__gt=now) | Q(expires_at__isnull=True, upload_expires_at__gt=now)
    totals = kept.aggregate(
        inputs=Count("pk"), landed_bytes=Sum("size_bytes", filter=landed),
        landing=Count("pk", filter=landing),
        freed_at=Min(Coalesce("expires_at", "upload_expires_at"), filter=pending))
    return StoredUsage(inputs=totals["inputs"], landed_bytes=totals["landed_bytes"] or 0,
                       landing=totals["landing"], freed_at=totals["freed_at"])


def _size(count: int) -> str:
    for unit, scale in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if count >= scale:
            return f"{count / scale:,.1f} {unit}"
    return f"{count:,} bytes"


def stored_quota_shortfall(*, organization: Organization, adding_bytes: int | None = None,
                           excluding: uuid.UUID | None = None,
                           cut_short: bool = False) -> tuple[StoredUsage, str | None]:
    """Why one more input does not fit the organization's quota (None when it does), and
    the usage it was judged on: `adding_bytes` is its real size once it has landed (or, with
    `cut_short`, the bytes read of a file stopped there), None while it has not (then it
    counts as the input cap); `excluding` its own row, where that exists already. A caller
    settling a landed file holds the organization lock (billing.services.organization_lock),
    so two landing together are judged in turn."""
    quota = stored_quota(organization)
    usage = stored_usage(organization=organization, excluding=excluding)
    cap = settings.ANEX_INPUT_MAX_BYTES
    adding = cap if adding_bytes is None else adding_bytes
    if usage.inputs + 1 > quota.inputs:
        return usage, (f"this organization keeps {usage.inputs:,} inputs, and its quota is "
                       f"{quota.inputs:,}")
    if usage.bytes + adding <= quota.bytes:
        return usage, None
    needs = (f"an upload not yet made counts as the {_size(cap)} input cap until its file "
             "lands" if adding_bytes is None else
             f"this file is more than {_size(adding - 1)}" if cut_short else
             f"this file is {_size(adding)}")
    reason = (f"this organization's inputs take {_size(usage.bytes)} of its "
              f"{_size(quota.bytes)} quota, and {needs}")
    if usage.landing:
        reason += (f" ({usage.landing:,} of its inputs have not landed yet and count as "
                   "the cap each until they do)")
    return usage, reason


def stored_quota_require(*, organization: Organization, adding_bytes: int | None = None,
                         excluding: uuid.UUID | None = None,
                         cut_short: bool = False) -> StoredUsage:
    """stored_quota_shortfall as a refusal: QuotaExceeded (the reference's 429 for an
    organization's cap, as its approval queue's) naming the quota, the usage and how to
    free space, Retry-After the seconds until the soonest of its inputs expires."""
    usage, reason = stored_quota_shortfall(organization=organization,
                                           adding_bytes=adding_bytes, excluding=excluding,
                                           cut_short=cut_short)
    if reason is None:
        return usage
    wait = (usage.freed_at - timezone.now()).total_seconds() if usage.freed_at else 0
    raise QuotaExceeded(f"Storage quota reached: {reason}. {FREE_SPACE} Retry-After is the "
                        "seconds until the soonest expires.",
                        retry_after=max(1, math.ceil(wait)) if wait > 0 else RETRY_AFTER_SECONDS)


def stored_quota_failure(reason: str) -> str:
    """The error of an input refused on landing (its file is deleted)."""
    return f"Storage quota reached: {reason}. {FREE_SPACE} Then create a new input."


def stored_room(*, organization: Organization) -> int:
    """The bytes one more input may take now: for an upload read as it streams, which
    stops there (its real size is checked again once stored, stored_quota_require)."""
    usage = stored_quota_require(organization=organization, adding_bytes=1)
    return min(settings.ANEX_INPUT_MAX_BYTES, stored_quota(organization).bytes - usage.bytes)
