"""The local storage backend's HTTP side, standing in for S3 in the embedded default:
the upload form POST (a signed, expiring policy naming the key, the size cap and the
region) and signed, expiring download links.

The upload is read as a stream (anex.multipart, the reader the OpenAI upload uses too), in
the order the reference prescribes (the fields, then the file, last): the client's rate,
the declared length and the policy are all checked before a byte of the file is read, and
the file goes straight to storage under its cap, once per input
(docs/dev/decisions/2026-12-01-inputs-and-results.md)."""

from __future__ import annotations

import itertools
import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.http import (
    FileResponse,
    Http404,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    UnreadablePostError,
)
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from anex.api.throttling import client_address
from anex.errors import RateLimited, Unavailable
from anex.multipart import FORM_OVERHEAD_BYTES, FormError, StreamedForm, form_boundary
from anex.redis import window_hit
from anex.regions import Region
from anex.transfers import (
    DOWNLOAD,
    UPLOAD,
    TransferFile,
    transfer_held,
    transfer_places_take,
)
from jobs.services.inputs import input_accepts_upload
from jobs.storage import (
    DOWNLOAD_SALT,
    UPLOAD_SALT,
    LocalRegionStorage,
    StorageExists,
    StorageTooLarge,
    key_organization,
    storage_for,
)

REQUEST_TIMEOUT = ("RequestTimeout: the connection was not read from within the timeout "
                   "period; nothing was kept. Upload the file again.")
USED = ("AccessDenied: this upload target has been used (its input is no longer awaiting "
        "an upload). Create a new input to upload another file.")


def _throttled(request: HttpRequest) -> float | None:
    """Seconds to wait when this client has started ANEX_UPLOADS_PER_MINUTE uploads this
    minute; None to go ahead (also when Redis is down: the limiter never takes uploads
    down with it)."""
    hit = window_hit("uploads", client_address(request), fail="open")
    if hit is None or hit.count <= settings.ANEX_UPLOADS_PER_MINUTE:
        return None
    return hit.seconds_left


def _local(region: str) -> LocalRegionStorage:
    try:
        storage = storage_for(Region(region))
    except ValueError:
        raise Http404 from None
    if not isinstance(storage, LocalRegionStorage):
        raise Http404
    return storage


def _error(status: int, detail: str) -> JsonResponse:
    return JsonResponse({"detail": detail}, status=status)


def _policy_problem(policy: dict[str, Any], fields: dict[str, str],
                    region: str) -> str | None:
    if policy.get("region") != region:
        return "AccessDenied: the policy is for another region's storage."
    if policy["expires"] < time.time():
        return "AccessDenied: the upload window has closed."
    if fields.get("key") != policy["key"]:
        return "AccessDenied: the key does not match the policy."
    return None


@csrf_exempt
@require_POST
def upload(request: HttpRequest, region: str) -> HttpResponse:
    # Everything a client can be refused for is decided before the file is read: the
    # rate, the declared length, then the policy from the fields that precede the file.
    wait = _throttled(request)
    if wait is not None:
        response = _error(429, "SlowDown: too many uploads from this client; retry later.")
        response["Retry-After"] = str(max(1, round(wait)))
        return response
    storage = _local(region)
    boundary = form_boundary(request.META.get("CONTENT_TYPE", ""))
    if not boundary:
        return _error(400, "InvalidArgument: send a multipart/form-data form POST.")
    try:
        length = int(request.META.get("CONTENT_LENGTH") or "")
    except ValueError:
        return _error(411, "MissingContentLength: send the request's Content-Length.")
    if length > settings.ANEX_INPUT_MAX_BYTES + FORM_OVERHEAD_BYTES:
        return _error(400, "EntityTooLarge: the file is over the input cap.")
    form = StreamedForm(request, boundary)
    try:
        form.read_fields()
    except FormError as exc:
        return _error(400, f"InvalidArgument: {exc}")
    except UnreadablePostError:  # stalled past the web role's socket timeout (S3's code)
        return _error(400, REQUEST_TIMEOUT)
    try:
        policy = signing.loads(form.fields.get("policy", ""), salt=UPLOAD_SALT)
    except signing.BadSignature:
        return _error(403, "AccessDenied: the policy is missing or its signature is invalid.")
    problem = _policy_problem(policy, form.fields, region)
    if problem:
        return _error(403, problem)
    if length > policy["max_bytes"] + FORM_OVERHEAD_BYTES:
        return _error(400, "EntityTooLarge: the file is over the input cap.")
    if not input_accepts_upload(object_key=policy["key"]) or storage.exists(policy["key"]):
        return _error(403, USED)  # settled, or its file landed and settles on the next read
    if not form.file_started:
        return _error(400, "InvalidArgument: send the file as the last form field, 'file'.")
    try:
        # The file is read only within one of the transfer places (anex.transfers).
        with transfer_held(direction=UPLOAD, organization_id=key_organization(policy["key"])):
            chunks = form.file_chunks()
            first = next((chunk for chunk in chunks if chunk), None)
            if first is None:
                return _error(400, "InvalidArgument: the file is empty.")
            # Write-once: a concurrent second POST of the same form cannot replace the file.
            storage.write_once(policy["key"], itertools.chain([first], chunks),
                               max_bytes=policy["max_bytes"])
    except (RateLimited, Unavailable) as busy:
        return _busy(busy)
    except StorageTooLarge:
        return _error(400, "EntityTooLarge: the file is over the input cap.")
    except StorageExists:
        return _error(403, USED)
    except FormError as exc:
        return _error(400, f"InvalidArgument: {exc}")
    except UnreadablePostError:
        return _error(400, REQUEST_TIMEOUT)
    return HttpResponse(status=204)


def _busy(refusal: RateLimited | Unavailable) -> JsonResponse:
    """A transfer cap, as S3 says it (SlowDown): 429 for the organization's, 503 for this
    server's, with Retry-After."""
    response = _error(refusal.status, f"SlowDown: {refusal.detail}")
    response["Retry-After"] = str(refusal.retry_after or 1)
    return response


@require_GET
def download(request: HttpRequest, region: str, key: str) -> HttpResponseBase:
    storage = _local(region)
    try:
        grant = signing.loads(request.GET.get("token", ""), salt=DOWNLOAD_SALT)
    except signing.BadSignature:
        return _error(403, "AccessDenied: the link's signature is invalid.")
    if grant["key"] != key or grant["expires"] < time.time():
        return _error(403, "AccessDenied: the link has expired.")
    path: Path = storage.path(key)
    if not path.is_file():
        return _error(404, "NoSuchKey: the object does not exist.")
    try:
        places = transfer_places_take(direction=DOWNLOAD, organization_id=key_organization(key))
    except (RateLimited, Unavailable) as busy:
        return _busy(busy)
    # The places are given back when the response closes the file (anex.transfers).
    return FileResponse(TransferFile(path, places), as_attachment=True,
                        filename=grant["filename"])
