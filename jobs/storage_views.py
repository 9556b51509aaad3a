"""The local storage backend's HTTP side, standing in for S3 in the embedded default:
the upload form POST (a signed, expiring policy naming the key and the size cap) and
signed, expiring download links."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.conf import settings
from django.core import signing
from django.core.files.uploadhandler import (
    FileUploadHandler,
    StopUpload,
    TemporaryFileUploadHandler,
)
from django.http import FileResponse, Http404, HttpRequest, HttpResponse, JsonResponse
from django.http.response import HttpResponseBase
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_GET, require_POST

from console.constants import Region
from jobs.storage import DOWNLOAD_SALT, UPLOAD_SALT, LocalRegionStorage, storage_for


class _CappedUpload(FileUploadHandler):
    """Stops reading the request as soon as the file passes the input cap."""

    def __init__(self, request: HttpRequest | None = None) -> None:
        super().__init__(request)
        self.received = 0
        self.too_large = False

    def receive_data_chunk(self, raw_data: bytes, start: int) -> bytes | None:
        self.received += len(raw_data)
        if self.received > settings.ANEX_INPUT_MAX_BYTES:
            self.too_large = True
            raise StopUpload(connection_reset=True)
        return raw_data

    def file_complete(self, file_size: int) -> None:
        return None


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


@csrf_exempt
@require_POST
def upload(request: HttpRequest, region: str) -> HttpResponse:
    storage = _local(region)
    cap = _CappedUpload(request)
    request.upload_handlers = [cap, TemporaryFileUploadHandler(request)]
    files: Any = request.FILES  # parses the form, streaming the file to a temporary file
    if cap.too_large:
        return _error(400, "EntityTooLarge: the file is over the input cap.")
    try:
        policy = signing.loads(request.POST.get("policy", ""), salt=UPLOAD_SALT)
    except signing.BadSignature:
        return _error(403, "AccessDenied: the policy is missing or its signature is invalid.")
    if policy["expires"] < time.time():
        return _error(403, "AccessDenied: the upload window has closed.")
    if request.POST.get("key") != policy["key"]:
        return _error(403, "AccessDenied: the key does not match the policy.")
    upload_file = files.get("file")
    if upload_file is None:
        return _error(400, "InvalidArgument: send the file as the last form field, 'file'.")
    if upload_file.size > policy["max_bytes"]:
        return _error(400, "EntityTooLarge: the file is over the input cap.")
    if upload_file.size == 0:
        return _error(400, "InvalidArgument: the file is empty.")
    storage.write_stream(policy["key"], upload_file.chunks(), max_bytes=policy["max_bytes"])
    return HttpResponse(status=204)


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
    return FileResponse(path.open("rb"), as_attachment=True, filename=grant["filename"])
