"""Request ids (docs/dev/decisions/2026-12-01-adopted-from-the-peer-api.md).

Every response carries X-Anex-Request-ID, ours, quoted to support. A caller's own
X-Request-ID is echoed back unchanged when it is well formed; one that is not (too long,
odd characters) is dropped rather than reflected into our headers and logs.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Callable
from contextvars import ContextVar

from django.http import HttpRequest, HttpResponse

REQUEST_ID_HEADER = "X-Anex-Request-ID"
CALLER_REQUEST_ID_HEADER = "X-Request-ID"
_CALLER_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:\-]{0,127}$")

current_request_id: ContextVar[str] = ContextVar("current_request_id", default="-")


def request_id_new() -> str:
    return f"req_{uuid.uuid4().hex}"


def caller_request_id(value: str | None) -> str | None:
    if value and _CALLER_ID.match(value):
        return value
    return None


class RequestIdMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        request_id = request_id_new()
        caller_id = caller_request_id(request.headers.get(CALLER_REQUEST_ID_HEADER))
        request.request_id = request_id  # type: ignore[attr-defined]
        token = current_request_id.set(request_id)
        try:
            response = self.get_response(request)
        finally:
            current_request_id.reset(token)
        response[REQUEST_ID_HEADER] = request_id
        if caller_id is not None:
            response[CALLER_REQUEST_ID_HEADER] = caller_id
        return response


class RequestIdLogFilter(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        record.request_id = current_request_id.get()
        return True
