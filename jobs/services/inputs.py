"""Inputs: direct uploads and URL ingests (the reference's "POST /inputs" sections).

An upload is minted an upload target and settles to ready once its object lands (checked
lazily on GET and on submit). An ingest is copied in by the input_copy_task actor, streamed
from the customer's URL through the SSRF-safe fetcher into storage, never whole in memory.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import PurePosixPath
from urllib.parse import urlsplit

from django.conf import settings
from django.db import transaction
from django.db.models import Case, Exists, F, OuterRef, Q, Value, When
from django.utils import timezone

from anex.crypto import secret_encrypt
from anex.errors import Invalid, RateLimited
from anex.errors import TooLarge as SourceTooLarge
from anex.net import DeadlineExceeded, FetchError, TooLarge, UnsafeURL, fetch
from anex.regions import Region, region_check, residency_resolve
from billing.services import credits_require_positive, organization_lock
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction
from console.models import Organization
from inference.constants import InputFormat
from jobs import dispatch
from jobs.constants import TERMINAL_STATUSES, InputStatus
from jobs.models import Input, Job, PreflightCheck
from jobs.services.quota import (
    stored_quota_failure,
    stored_quota_require,
    stored_quota_shortfall,
)
from jobs.services.webhooks import delivery_enqueue, webhook_secret_new
from jobs.storage import StorageTooLarge, storage_for

logger = logging.getLogger(__name__)

# How long one copy may take before the recovery pass calls its worker dead and starts
# again; after INGEST_ATTEMPTS copies the ingest fails.
COPY_TIME_LIMIT = timedelta(minutes=60)
INGEST_ATTEMPTS = 3
# The slowest source we wait for: a copy whose source stalls this long fails.
COPY_READ_TIMEOUT_SECONDS = 60
# A copy's whole fetch, connect to last byte, however the source paces its bytes: inside
# COPY_TIME_LIMIT, so a source trickling its file fails the copy it holds (one attempt,
# terminal) before the recovery pass would take the worker for dead and copy again.
COPY_DEADLINE_SECONDS = COPY_TIME_LIMIT.total_seconds() * 0.9
# The size probe runs inside POST /inputs, so it gets a few seconds in all, whatever the
# source does: a source too slow to answer is accepted and refused by the copy (reference).
PROBE_DEADLINE_SECONDS = 3.0
# Ingests an organization may have pending or copying at once: the copies share the ingest
# workers with every other customer (docs/dev/decisions/2026-12-01-inputs-and-results.md).
INGEST_CONCURRENCY_LIMIT = 10
INGEST_RETRY_AFTER = 30
SNIFF_BYTES = 512
# The failure_reason of a job whose input is not the file it was checked on (a replayed
# upload form swapped it): it never runs on rows nobody estimated.
INPUT_CHANGED = ("The input file changed after it was checked, so this job was not run on "
                 "it and nothing was charged for it. Create a new input with the file and "
                 "submit the job again.")


def _object_key(organization: Organization, input_id: uuid.UUID, fmt: str) -> str:
    return f"inputs/{organization.pk}/{input_id}.{fmt}"


EMPTY_FILE = "The file is empty."


def format_problem(head: bytes, fmt: str) -> str | None:
    """Why the first bytes cannot be a file of this format, or None: the format check
    every input passes, on its first SNIFF_BYTES (an upload as it settles, an ingest as
    it is copied, an OpenAI file at its batch's create: input_format_problem)."""
    if fmt == InputFormat.PARQUET:
        return None if head.startswith(b"PAR1") else \
            "The file is not parquet: it does not start with the PAR1 magic bytes."
    text = head.removeprefix(b"\xef\xbb\xbf").lstrip()
    if not text:
        return EMPTY_FILE
    if not text.startswith(b"{"):
        return "The file is not JSONL: its first line is not a JSON object."
    return None


@dataclass(frozen=True)
class InputCreated:
    """A new input, and what its creator is shown once: an upload's target (upload_url and
    fields), or an ingest's callback secret."""

    input: Input
    target: dict[str, object] | None = None
    callback_secret: str | None = None


def _https(name: str, url: str) -> None:
    try:
        parts = urlsplit(url)
        valid = parts.scheme == "https" and bool(parts.hostname)
    except ValueError:  # urlsplit refuses an unbalanced or invalid [IPv6] host
        valid = False
    if not valid:
        raise Invalid(f"{name} must be an https:// URL.")


def input_create(*, organization: Organization, actor: Actor, host_region: Region,
                 input_format: str | None, source_url: str | None = None,
                 callback_url: str | None = None,
                 data_residency: str | None = None) -> InputCreated:
    """POST /inputs, and the console's upload: every check the reference makes before an
    upload target is minted or a source URL is contacted, in its order - the format and
    the mode's fields (400), the data residency asked for (403) and the host it reached
    (421), the balance (402) - then the upload target (no source_url) or the ingest.

    host_region is the region of the API host the request reached; the console, which is
    no regional host, passes the organization's own (anex.regions.organization_region).
    """
    if input_format is not None and input_format not in InputFormat.values:
        raise Invalid("format must be jsonl or parquet.")
    fmt = InputFormat(input_format) if input_format else None
    if source_url is None:
        if fmt is None:
            raise Invalid("format is required for a direct upload (jsonl or parquet); to "
                          "ingest from a URL, give source_url.")
        if callback_url is not None:
            raise Invalid("callback_url is not available for a direct upload: there is no "
                          "server-side copy to report on.")
    else:
        _https("source_url", source_url)
        if callback_url is not None:
            _https("callback_url", callback_url)
    residency = input_admit(organization=organization, host_region=host_region,
                            requested=data_residency)
    if source_url is None:
        assert fmt is not None
        item, target = input_upload_create(organization=organization, actor=actor, fmt=fmt,
                                           residency=residency)
        return InputCreated(input=item, target=target)
    item, secret = input_ingest_create(organization=organization, actor=actor,
                                       source_url=source_url, fmt=fmt,
                                       callback_url=callback_url, residency=residency)
    return InputCreated(input=item, callback_secret=secret)


def input_admit(*, organization: Organization, host_region: Region,
                requested: str | None) -> Region:
    """What every new input is admitted on, in the reference's order, before a byte of it
    is taken (an upload target minted, a source URL contacted, an OpenAI file read): the
    data residency asked for (403) and the host the request reached (421), then the
    balance (402). Its region."""
    residency = residency_resolve(organization=organization, requested=requested)
    region_check(host_region=host_region, residency=residency, noun="input")
    credits_require_positive(organization=organization)
    return residency


def input_format_problem(*, item: Input) -> str | None:
    """format_problem of a ready input's stored bytes (those it froze on): for an input
    written without the check (an OpenAI file's, which is answered at its batch's create,
    openai_api.batches)."""
    assert item.size_bytes is not None, "a ready input has its size"
    return _stored_format_problem(item, size=item.size_bytes, pin=item.content_pin)


def _stored_format_problem(item: Input, *, size: int, pin: str) -> str | None:
    # Never a range past the object's end: S3 refuses one on an empty object (416).
    head = storage_for(item.data_residency).read_range(item.object_key, 0,
                                                       min(size, SNIFF_BYTES), pin=pin)
    return format_problem(head, item.format)


def input_upload_create(*, organization: Organization, actor: Actor, fmt: InputFormat,
                        residency: Region) -> tuple[Input, dict[str, object]]:
    input_id = uuid.uuid4()
    key = _object_key(organization, input_id, fmt)
    storage = storage_for(residency)
    target = storage.upload_target(key=key, max_bytes=settings.ANEX_INPUT_MAX_BYTES,
                                   expires_in=settings.ANEX_UPLOAD_WINDOW_SECONDS)
    with transaction.atomic():
        # Counted under the organization lock, so concurrent requests cannot overshoot.
        organization_lock(organization.pk)
        stored_quota_require(organization=organization)
        item = Input.objects.create(
            id=input_id, organization=organization, status=InputStatus.AWAITING_UPLOAD,
            format=fmt, data_residency=residency, object_key=key,
            input_s3_uri=storage.uri(key), created_by_key=actor.key,
            upload_expires_at=target.expires_at,
        )
        audit_record(organization=organization, actor=actor, action=AuditAction.INPUT_CREATED,
                     target=item, data={"mode": "upload", "format": fmt,
                                        "data_residency": residency})
    return item, {"upload_url": target.url, "fields": target.fields}


def input_derived_create(*, organization: Organization, actor: Actor, fmt: InputFormat,
                         residency: Region, chunks: Iterable[bytes], mode: str,
                         max_bytes: int | None = None) -> Input:
    """An input written from bytes in hand (a re-run's rows, jobs.services.rerun; an OpenAI
    file's upload): stored under `max_bytes` (the input cap by default; StorageTooLarge
    past it), frozen on its bytes and ready at once, kept as long as an upload. Call it
    inside the transaction that uses it; the caller removes the object (jobs.storage
    delete) if that transaction does not commit."""
    input_id = uuid.uuid4()
    key = _object_key(organization, input_id, fmt)
    storage = storage_for(residency)
    storage.write_stream(key, chunks, max_bytes=settings.ANEX_INPUT_MAX_BYTES
                         if max_bytes is None else max_bytes)
    size, pin = storage.fingerprint(key)
    item = Input.objects.create(
        id=input_id, organization=organization, format=fmt, data_residency=residency,
        object_key=key, input_s3_uri=storage.uri(key), created_by_key=actor.key,
        **_ready_fields(size, pin))  # type: ignore[arg-type]
    audit_record(organization=organization, actor=actor, action=AuditAction.INPUT_CREATED,
                 target=item, data={"mode": mode, "format": fmt, "data_residency": residency})
    return item


def _advertised_size(source_url: str, *, organization_id: uuid.UUID) -> int | None:
    """The size the source advertises, read from a GET's headers without reading its
    body (a presigned GET URL refuses HEAD). None when it does not say or cannot be asked
    within PROBE_DEADLINE_SECONDS; refused addresses raise UnsafeURL."""
    try:
        with fetch("GET", source_url, tenant=organization_id, connect_timeout=3,
                   read_timeout=3,
                   deadline=PROBE_DEADLINE_SECONDS,
                   max_bytes=settings.ANEX_INPUT_MAX_BYTES) as response:
            return response.content_length if 200 <= response.status < 300 else None
    except UnsafeURL:
        raise
    except FetchError:
        return None


def input_ingest_create(*, organization: Organization, actor: Actor, source_url: str,
                        fmt: InputFormat | None, callback_url: str | None,
                        residency: Region) -> tuple[Input, str | None]:
    """Accept an ingest; returns it and the callback secret, shown this once."""
    # Checked before the probe too, so an organization at its limit makes us contact
    # nothing; the count that decides is taken again under the lock below.
    _ingest_capacity_check(organization)
    stored_quota_require(organization=organization)
    try:
        size = _advertised_size(source_url, organization_id=organization.pk)
    except UnsafeURL as exc:
        raise Invalid(f"source_url cannot be fetched: {exc}") from None
    cap = settings.ANEX_INPUT_MAX_BYTES
    if size is not None and size > cap:
        raise SourceTooLarge(f"The source advertises {size:,} bytes, over the input cap "
                             f"of {cap:,} bytes.")
    if fmt is None:
        suffix = PurePosixPath(urlsplit(source_url).path).suffix.lower()
        fmt = InputFormat.PARQUET if suffix == ".parquet" else InputFormat.JSONL
    input_id = uuid.uuid4()
    key = _object_key(organization, input_id, fmt)
    secret = webhook_secret_new() if callback_url else None
    with transaction.atomic():
        # Counted under the organization lock, so concurrent requests cannot overshoot.
        organization_lock(organization.pk)
        _ingest_capacity_check(organization)
        stored_quota_require(organization=organization)
        item = Input.objects.create(
            id=input_id, organization=organization, status=InputStatus.PENDING, format=fmt,
            data_residency=residency, object_key=key,
            input_s3_uri=storage_for(residency).uri(key), source_url=source_url,
            callback_url=callback_url or "",
            callback_secret_encrypted=secret_encrypt(secret) if secret else "",
            created_by_key=actor.key,
        )
        audit_record(organization=organization, actor=actor, action=AuditAction.INPUT_CREATED,
                     target=item, data={"mode": "ingest", "format": fmt,
                                        "data_residency": residency,
                                        "callback": bool(callback_url)})
        dispatch.send_on_commit("input_copy_task", str(item.pk))
    return item, secret


def _ingest_capacity_check(organization: Organization) -> None:
    """429 while the organization has INGEST_CONCURRENCY_LIMIT ingests pending or copying."""
    active = Input.objects.filter(
        organization=organization,
        status__in=[InputStatus.PENDING, InputStatus.COPYING]).count()
    if active >= INGEST_CONCURRENCY_LIMIT:
        raise RateLimited(
            f"Too many ingests in progress: this organization already has {active} "
            f"pending or copying (the limit is {INGEST_CONCURRENCY_LIMIT}). Wait for "
            "some to become ready or fail, then retry.",
            retry_after=INGEST_RETRY_AFTER)


def _ready_fields(size: int, pin: str) -> dict[str, object]:
    """Ready, frozen on the bytes that landed: `pin` (jobs.storage fingerprint) is what
    every later read is checked against."""
    now = timezone.now()
    return {"status": InputStatus.READY, "size_bytes": size, "content_pin": pin,
            "ready_at": now,
            "expires_at": now + timedelta(days=settings.ANEX_INPUT_RETENTION_DAYS),
            "error": ""}


def input_accepts_upload(*, object_key: str) -> bool:
    """Whether an upload target's key may still receive its file: only while its input
    awaits one. Once it settled (ready, failed, expired) the form is spent, so replaying
    it cannot swap the file a job was estimated on."""
    return Input.objects.filter(object_key=object_key,
                                status=InputStatus.AWAITING_UPLOAD).exists()


def input_refresh(*, item: Input) -> Input:
    """Settle what time and the upload have decided: an upload that landed is ready (or
    failed, when it is not the format it claims); a lapsed window or retention expires."""
    now = timezone.now()
    if item.status == InputStatus.AWAITING_UPLOAD:
        storage = storage_for(item.data_residency)
        if storage.exists(item.object_key):
            # Frozen first: the sniff below and every later read are of these bytes.
            size, pin = storage.fingerprint(item.object_key)
            problem = _stored_format_problem(item, size=size, pin=pin)
            _upload_settle(item, size=size, pin=pin, problem=problem)
        elif item.upload_expires_at is not None and item.upload_expires_at <= now:
            Input.objects.filter(pk=item.pk, status=InputStatus.AWAITING_UPLOAD).update(
                status=InputStatus.EXPIRED,
                error="The upload window closed before a file arrived. Create a new input.")
    elif item.status == InputStatus.READY and item.expires_at and item.expires_at <= now:
        Input.objects.filter(pk=item.pk, status=InputStatus.READY).update(
            status=InputStatus.EXPIRED)
    item.refresh_from_db()
    return item


def _upload_settle(item: Input, *, size: int, pin: str, problem: str | None) -> None:
    """awaiting_upload -> ready on the landed file, or failed: not the format it claims
    (`problem`), or, on the stored object's real size (whatever the client declared), past
    the organization's stored-input quota. A failed upload's file is deleted at once; its
    form could still be replayed until its window closes, so the expiry sweep deletes its
    key once more after that (inputs_expire)."""
    with transaction.atomic():
        # The real size is judged under the organization lock: two uploads landing
        # together cannot both take the last of the room.
        organization_lock(item.organization_id)
        if problem is None:
            _usage, shortfall = stored_quota_shortfall(
                organization=Organization.objects.get(pk=item.organization_id),
                adding_bytes=size, excluding=item.pk)
            problem = stored_quota_failure(shortfall) if shortfall else None
        fields = {"status": InputStatus.FAILED, "error": problem} if problem \
            else _ready_fields(size, pin)
        settled = Input.objects.filter(pk=item.pk, status=InputStatus.AWAITING_UPLOAD) \
            .update(**fields)
    if settled and problem:
        storage_for(item.data_residency).delete(item.object_key)


def _stream(response_chunks: Iterator[bytes], fmt: str) -> Iterator[bytes]:
    """The source's bytes, with the format checked on the first chunk. (The pace is the
    fetch's deadline: a chunk a trickling source never finishes never reaches a check
    here.)"""
    first = True
    for chunk in response_chunks:
        if first and chunk:
            problem = format_problem(chunk[:SNIFF_BYTES], fmt)
            if problem:
                raise _CopyFailed(problem)
            first = False
        yield chunk
    if first:
        raise _CopyFailed(EMPTY_FILE)


class _CopyFailed(Exception):
    pass


def input_copy(*, input_id: uuid.UUID | str) -> InputStatus | None:
    """Copy an ingest's source into storage (the input_copy_task actor). Runs once per input:
    a redelivered message finds it no longer pending and does nothing."""
    now = timezone.now()
    claimed = Input.objects.filter(pk=input_id, status=InputStatus.PENDING).update(
        status=InputStatus.COPYING, copy_started_at=now, attempts=F("attempts") + 1)
    if claimed != 1:
        return None
    item = Input.objects.select_related("organization").get(pk=input_id)
    storage = storage_for(item.data_residency)
    cap = settings.ANEX_INPUT_MAX_BYTES
    error = ""
    size, pin = 0, ""
    try:
        with fetch("GET", item.source_url, tenant=item.organization_id, max_bytes=cap,
                   read_timeout=COPY_READ_TIMEOUT_SECONDS,
                   deadline=COPY_DEADLINE_SECONDS) as response:
            if not 200 <= response.status < 300:
                raise _CopyFailed(f"The source answered HTTP {response.status}.")
            size = storage.write_stream(
                item.object_key, _stream(response.iter_chunks(), item.format), max_bytes=cap)
            size, pin = storage.fingerprint(item.object_key)
    except (TooLarge, StorageTooLarge):
        error = f"The source is larger than the input cap of {cap:,} bytes."
    except DeadlineExceeded:
        error = ("The source was too slow: the copy did not finish within "
                 f"{COPY_DEADLINE_SECONDS / 60:g} minutes.")
    except (FetchError, _CopyFailed) as exc:
        error = str(exc)
    _copy_settle(item, error=error, size=size, pin=pin, started=now)
    if error:
        logger.info("ingest %s failed: %s", item.pk, error)
    return InputStatus.FAILED if error else InputStatus.READY


@transaction.atomic
def _copy_settle(item: Input, *, error: str, size: int, started: datetime,
                 pin: str = "") -> bool:
    """copying -> ready or failed (guarded on this copy's claim) and its callback. A copy
    past the organization's stored-input quota on its real size fails, its file deleted
    (judged under the organization lock, as an upload landing is)."""
    if not error:
        organization_lock(item.organization_id)
        _usage, shortfall = stored_quota_shortfall(organization=item.organization,
                                                   adding_bytes=size, excluding=item.pk)
        error = stored_quota_failure(shortfall) if shortfall else ""
    fields = _ready_fields(size, pin) if not error else {"status": InputStatus.FAILED,
                                                     "error": error}
    # The source URL may carry the customer's credentials: keep it no longer than needed.
    updated = Input.objects.filter(pk=item.pk, status=InputStatus.COPYING,
                                   copy_started_at=started).update(source_url="", **fields)
    if updated and error:
        # Whatever the copy stored goes now (the expiry sweep would take it later).
        key, storage = item.object_key, storage_for(item.data_residency)
        transaction.on_commit(lambda: storage.delete(key))
    if updated and item.callback_url:
        item.refresh_from_db()
        delivery_enqueue(
            organization=item.organization, url=item.callback_url, input=item,
            event_type="input.ready" if not error else "input.failed",
            data={"input_id": str(item.pk), "status": item.status,
                  "input_s3_uri": item.input_s3_uri, "error": item.error or None},
        )
    return bool(updated)


def input_copy_resend(item: Input) -> None:
    """The recovery pass: an ingest still pending (its message lost) is sent again."""
    dispatch.send("input_copy_task", str(item.pk))


def input_copy_revive(item: Input) -> None:
    """The recovery pass: a copy whose worker died (copying past its time limit) starts
    again, once per dead claim."""
    if Input.objects.filter(pk=item.pk, status=InputStatus.COPYING,
                            copy_started_at=item.copy_started_at).update(
            status=InputStatus.PENDING) == 1:
        input_copy_resend(item)


def input_copy_give_up(item: Input) -> None:
    """The recovery pass: a copy that died INGEST_ATTEMPTS times fails, with its callback."""
    assert item.copy_started_at is not None
    _copy_settle(Input.objects.select_related("organization").get(pk=item.pk),
                 error=f"The copy was interrupted {item.attempts} times before it finished. "
                       "Create the input again.", size=0, started=item.copy_started_at)


def inputs_expire() -> int:
    """Delete the objects of inputs past their 7 days (or past an unused upload window),
    and of failed ones once no upload form can reach them. One a job still reads is kept
    until every job on it has ended (issue 40 L11: an input is never expired under a job
    that reads it; input_data_purge), then deleted by the next sweep."""
    now = timezone.now()
    # An upload may land just as its window closes: settle it before judging it.
    for item in Input.objects.filter(status=InputStatus.AWAITING_UPLOAD,
                                     upload_expires_at__lte=now).iterator():
        input_refresh(item=item)
    unfinished = Job.objects.filter(input=OuterRef("pk")).exclude(
        status__in=TERMINAL_STATUSES)
    due = Input.objects.filter(deleted_at__isnull=True).filter(
        Q(expires_at__lte=now)
        | Q(status=InputStatus.EXPIRED)
        | Q(status=InputStatus.FAILED) & (Q(upload_expires_at__isnull=True)
                                          | Q(upload_expires_at__lte=now))
    ).filter(~Exists(unfinished))
    return sum(input_data_purge(item=item) for item in due.iterator())


def input_data_purge(*, item: Input) -> bool:
    """Delete an input's object (its expiry, DELETE /jobs/{id}/data, DELETE
    /openai/v1/files/{id}); False when it is kept for now. It reads expired at once, so a
    later submit against it is the reference's 410, and its checks' quoted rows go. Its
    object is not deleted under a job that still reads it (issue 40 L11): the input may be
    shared by jobs, and one unfinished keeps the bytes until it ends; then the expiry sweep
    (inputs_expire) deletes them."""
    # Expired first: a submit that reads the input from here on is refused, so no job
    # starts on it between the look at its jobs below and the delete.
    Input.objects.filter(pk=item.pk, deleted_at__isnull=True).update(
        status=Case(When(status=InputStatus.READY, then=Value(InputStatus.EXPIRED)),
                    default=F("status")))
    input_quotes_purge(input_id=item.pk)
    if Job.objects.filter(input_id=item.pk).exclude(status__in=TERMINAL_STATUSES).exists():
        return False
    storage_for(item.data_residency).delete(item.object_key)
    Input.objects.filter(pk=item.pk, deleted_at__isnull=True).update(deleted_at=timezone.now())
    return True


def input_quotes_purge(*, input_id: uuid.UUID) -> None:
    """A deleted input's rows are not kept elsewhere: its checks' `errors` quote them (a
    reason names a row's custom_id and its content), so they go with it; the counts stay."""
    PreflightCheck.objects.filter(input_id=input_id).exclude(errors=[]).update(errors=[])
