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
import re
import time
from collections.abc import Iterator
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
    StreamingHttpResponse,
    UnreadablePostError,
)
from django.http.response import HttpResponseBase
from django.utils.http import content_disposition_header, http_date
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
    TransferStream,
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
    content_type_of,
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


# One byte range (RFC 9110 14.1.2): first-last, first-, or -suffix.
_RANGE = re.compile(r"bytes=(\d*)-(\d*)")
_BLOCK = 1024 * 1024
INVALID_RANGE = "InvalidRange: the requested range is not satisfiable."


def _byte_range(request: HttpRequest, size: int, validators: tuple[str, str]
                ) -> tuple[int, int] | None:
    """The byte range a download asks for, as S3 reads the Range header: (first, last),
    both within the object; None for the whole object (no Range, a malformed or multiple
    one, or an If-Range naming another version than this one's ETag or Last-Modified).
    ValueError when the range lies past the object's end (416)."""
    header = request.headers.get("Range", "")
    if not header:
        return None
    if_range = request.headers.get("If-Range")
    if if_range is not None and if_range not in validators:
        return None  # the client holds another version: the whole of this one
    match = _RANGE.fullmatch(header.replace(" ", ""))
    if match is None or not (match[1] or match[2]):
        return None
    if not match[1]:  # the last n bytes
        suffix = int(match[2])
        if not suffix or not size:
            raise ValueError(header)
        return max(size - suffix, 0), size - 1
    first = int(match[1])
    if match[2] and int(match[2]) < first:
        return None  # not a valid range: ignored, as RFC 9110 says
    if first >= size:
        raise ValueError(header)
    return first, min(int(match[2]) if match[2] else size - 1, size - 1)


def _blocks(handle: TransferFile, first: int, length: int) -> Iterator[bytes]:
    """`length` bytes of the open file from `first`, a block at a time; the file closed
    (its places given back) however the response ends."""
    try:
        handle.seek(first)
        while length > 0:
            block = handle.read(min(_BLOCK, length))
            if not block:
                return
            length -= len(block)
            yield block
    finally:
        handle.close()


@require_GET
def download(request: HttpRequest, region: str, key: str) -> HttpResponseBase:
    """A signed link's object, whole or (Range) the byte range asked for, as S3 answers a
    GET: 206 with Content-Range, 416 past its end, Accept-Ranges, its content type, and
    an ETag and Last-Modified that If-Range may name, so an interrupted download resumes."""
    storage = _local(region)
    try:
        grant = signing.loads(request.GET.get("token", ""), salt=DOWNLOAD_SALT)
    except signing.BadSignature:
        return _error(403, "AccessDenied: the link's signature is invalid.")
    if grant["key"] != key or grant["expires"] < time.time():
        return _error(403, "AccessDenied: the link has expired.")
    path: Path = storage.path(key)
    try:
        stat = path.stat()
    except OSError:
        stat = None
    if stat is None or not path.is_file():
        return _error(404, "NoSuchKey: the object does not exist.")
    etag = f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'
    modified = http_date(int(stat.st_mtime))
    try:
        wanted = _byte_range(request, stat.st_size, (etag, modified))
    except ValueError:
        refused = _error(416, INVALID_RANGE)
        refused["Content-Range"] = f"bytes */{stat.st_size}"
        return refused
    try:
        places = transfer_places_take(direction=DOWNLOAD, organization_id=key_organization(key))
    except (RateLimited, Unavailable) as busy:
        return _busy(busy)
    # The places are given back when the response closes the file (anex.transfers).
    handle = TransferFile(path, places)
    response: HttpResponseBase
    if wanted is None:
        response = FileResponse(handle, as_attachment=True, filename=grant["filename"],
                                content_type=content_type_of(key))
    else:
        first, last = wanted
        length = last - first + 1
        response = StreamingHttpResponse(TransferStream(_blocks(handle, first, length), places),
                                         status=206, content_type=content_type_of(key))
        response["Content-Range"] = f"bytes {first}-{last}/{stat.st_size}"
        response["Content-Length"] = str(length)
        disposition = content_disposition_header(as_attachment=True, filename=grant["filename"])
        if disposition:
            response["Content-Disposition"] = disposition
    response["Accept-Ranges"] = "bytes"
    response["ETag"] = etag
    response["Last-Modified"] = modified
    return response
