"""Idempotency-Key on the batch API's POSTs, with Stripe's semantics
(docs/dev/decisions/2026-12-01-idempotency-keys-progress-and-the-cli.md).

A POST that carries `Idempotency-Key: <key>` does its work in one transaction that first
inserts the organization's record of that key, and stores the response in it before
committing. So:

- the same key with the same request within 24 hours answers the stored status and body
  (with `Idempotent-Replayed: true`) and does nothing again;
- the same key with another request (another endpoint, another job, another body, sent
  with another API key or to the other region's host) is 422: a key never replays an
  answer its own scopes or budget would not have given;
- a duplicate that arrives while the first is still running waits on the unique index
  for the first's transaction to end, then replays its response: the work is done once.
  Past WAIT_SECONDS it is answered 409 with Retry-After instead, as Stripe answers a
  concurrent duplicate.
- an error response did nothing (the services roll back whatever they began), so it is not
  stored: the record rolls back with it and the same key may be retried, and the retry runs.

A request without the header is handled exactly as before: the reference's own answers do
not change. Keys are per organization; a record keeps the response body encrypted (an
ingest's answer carries its callback secret) and is purged a day after it was written
(`idempotency_records_purge`, on the periodic clock).
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import IntegrityError, OperationalError, connection, transaction
from django.http import QueryDict
from django.utils import timezone
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request
from rest_framework.response import Response

from anex.api.errors import ApiError, error_response
from anex.crypto import DecryptionFailed, secret_decrypt, secret_encrypt
from anex.errors import Conflict, Malformed
from anex.regions import request_region
from console.models import ApiKey, Organization
from jobs.models import IdempotencyRecord

if TYPE_CHECKING:
    from rest_framework.views import APIView

HEADER = "Idempotency-Key"
REPLAYED_HEADER = "Idempotent-Replayed"
KEY_MAX_LENGTH = 255
TTL = timedelta(hours=24)
# How long a duplicate waits for the first request with its key to finish. A submit or an
# approval takes well under a second; a duplicate still waiting after this is answered 409.
WAIT_SECONDS = 10
IN_FLIGHT_RETRY_AFTER = 1
# PostgreSQL's lock_not_available: the wait on the first request's insert ran out.
_LOCK_NOT_AVAILABLE = "55P03"
_UNIQUE_KEY = "idempotency_unique_key"

BAD_KEY_DETAIL = (f"{HEADER} must be 1 to {KEY_MAX_LENGTH} printable ASCII characters "
                  "(a UUID is a good key).")
MISMATCH_DETAIL = (f"This {HEADER} was already used in the last 24 hours for a different "
                   "request (another endpoint, job or body, or another API key or API host): "
                   "use a new key for a new request.")
IN_FLIGHT_DETAIL = (f"A request with this {HEADER} is still being processed. Retry after the "
                    "seconds in the Retry-After header to get its response.")
UNREADABLE_DETAIL = (f"The response kept under this {HEADER} can no longer be read (the "
                     "server's encryption key changed). Check whether the first request took "
                     "effect, then use a new key.")

IDEMPOTENCY_PARAMETER = OpenApiParameter(
    HEADER, {"type": "string", "pattern": f"^[ -~]{{1,{KEY_MAX_LENGTH}}}$"},
    OpenApiParameter.HEADER, required=False,
    description="Optional, up to 255 printable ASCII characters, unique per request you "
                "mean to make once. Repeating the same key with the same request within 24 "
                "hours returns the first response (status and body, with the header "
                f"{REPLAYED_HEADER}: true) without doing the work again; the same key with "
                "a different request answers 422; a repeat sent while the first is still "
                "being processed waits for it, or answers 409 with Retry-After. Only "
                "successful responses are kept: after an error the same key may be retried.",
)
IN_FLIGHT_DESCRIPTION = "a request with the same Idempotency-Key still in progress"

Handler = TypeVar("Handler", bound=Callable[..., Response])


def fingerprint_of(method: str, path: str, data: Any, *, api_key: ApiKey, region: str) -> str:
    """What makes two requests "the same": method, path, the body's JSON with its keys
    sorted (whitespace and key order do not matter; any value does), the API key that sent
    it and the region of the host it reached. Another key (other scopes, another budget)
    or the other region's host never replays this one's answer."""
    body = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(
        f"{method} {path}\n{api_key.pk} {region}\n{body}".encode()).hexdigest()


def request_fingerprint(request: Request, api_key: ApiKey) -> str:
    data: Any = request.data
    if isinstance(data, QueryDict):
        data = {name: data.getlist(name) for name in data}
    return fingerprint_of(request.method or "", request.path, data, api_key=api_key,
                          region=request_region(request))


def _key_valid(key: str) -> bool:
    return 0 < len(key) <= KEY_MAX_LENGTH and all(" " <= ch <= "~" for ch in key)


class _InFlight(Exception):
    """The first request with this key did not finish within WAIT_SECONDS."""


def _insert(*, organization: Organization, key: str, fingerprint: str) -> bool:
    """Insert this request's record (True), or find the key taken (False). A record another
    transaction has inserted and not yet committed blocks the insert until that transaction
    ends, for at most WAIT_SECONDS (then 409)."""
    try:
        with transaction.atomic():  # a savepoint: its rollback also undoes the SET LOCAL
            with connection.cursor() as cursor:
                cursor.execute("SELECT current_setting('lock_timeout'), "
                               "set_config('lock_timeout', %s, true)",
                               [f"{WAIT_SECONDS * 1000}ms"])
                (previous, _) = cursor.fetchone() or ("0", None)
                IdempotencyRecord.objects.create(
                    organization=organization, key=key, fingerprint=fingerprint,
                    expires_at=timezone.now() + TTL)
                # Only the wait on the key is bounded; the work that follows keeps the
                # session's own lock timeout.
                cursor.execute("SELECT set_config('lock_timeout', %s, true)", [previous])
        return True
    except IntegrityError as exc:
        if getattr(getattr(exc.__cause__, "diag", None), "constraint_name", None) != _UNIQUE_KEY:
            raise
        return False
    except OperationalError as exc:
        if getattr(exc.__cause__, "sqlstate", None) == _LOCK_NOT_AVAILABLE:
            raise _InFlight() from None
        raise


def idempotency_claim(*, organization: Organization, key: str,
                      fingerprint: str) -> IdempotencyRecord | None:
    """Inside the request's transaction: None when this request holds the key and does the
    work; the stored record when the same request already succeeded; 422 when the key was
    used for another request. An expired record is removed and the key taken afresh."""
    for _ in range(3):
        if _insert(organization=organization, key=key, fingerprint=fingerprint):
            return None
        record = IdempotencyRecord.objects.for_org(organization).filter(key=key).first()
        if record is None:
            continue  # purged in between: take it
        if record.expires_at <= timezone.now():
            IdempotencyRecord.objects.filter(pk=record.pk).delete()
            continue
        if record.fingerprint != fingerprint:
            raise Malformed(MISMATCH_DETAIL)
        return record
    # Three takes each lost to an expiry or a purge racing it: as if still in flight.
    raise _InFlight()


def idempotency_store(*, organization: Organization, key: str, response: Response) -> None:
    """Keep a successful response under the key (in the request's transaction); forget the
    key after an error response, so it can be retried."""
    records = IdempotencyRecord.objects.for_org(organization).filter(key=key)
    if response.status_code < 400:
        body = json.dumps(response.data, separators=(",", ":"))
        records.update(status_code=response.status_code, body_encrypted=secret_encrypt(body))
    else:
        records.delete()


def idempotency_records_purge() -> int:
    """Remove the records past their 24 hours (the periodic clock)."""
    deleted, _ = IdempotencyRecord.objects.filter(expires_at__lte=timezone.now()).delete()
    return deleted


def _replay(record: IdempotencyRecord) -> Response:
    assert record.status_code is not None, "a committed record always has its response"
    try:
        body = json.loads(secret_decrypt(record.body_encrypted))
    except DecryptionFailed:
        raise Conflict(UNREADABLE_DETAIL) from None
    return Response(body, status=record.status_code, headers={REPLAYED_HEADER: "true"})


def idempotent(handler: Handler) -> Handler:
    """Give a POST handler of an APIView the Idempotency-Key semantics above."""

    @functools.wraps(handler)
    def wrapper(view: APIView, request: Request, *args: Any, **kwargs: Any) -> Response:
        key = request.headers.get(HEADER)
        if key is None:
            return handler(view, request, *args, **kwargs)
        if not _key_valid(key):
            raise Malformed(BAD_KEY_DETAIL)
        # The decorated views authenticate by API key first (anex.api.authentication).
        assert isinstance(request.auth, ApiKey), "an Idempotency-Key view without an API key"
        organization = request.auth.organization
        fingerprint = request_fingerprint(request, request.auth)
        try:
            with transaction.atomic():
                record = idempotency_claim(organization=organization, key=key,
                                           fingerprint=fingerprint)
                if record is not None:
                    return _replay(record)
                response = handler(view, request, *args, **kwargs)
                idempotency_store(organization=organization, key=key, response=response)
                return response
        except _InFlight:
            # error_response sets Retry-After on 429 and 503 only.
            answer = error_response(ApiError(409, IN_FLIGHT_DETAIL))
            answer["Retry-After"] = str(IN_FLIGHT_RETRY_AFTER)
            return answer

    return wrapper  # type: ignore[return-value]
