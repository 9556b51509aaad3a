"""One handler: every API error body is {"detail": …} (docs/dev/style.md rule 7).

Services raise the status-less refusals of anex/errors.py; the handler below answers each
with the status its class has in anex.errors.ANSWERED_WITH, and also maps Django's and
DRF's own exceptions onto the same envelope, so a client never sees an HTML page or a
differently shaped body from /batch/v1 or /realtime/v1. The console's pages go through the
same mapping (console.views.base). ApiError is the handler's own form of an answer, which
a view (never a service) may also raise.
"""

from __future__ import annotations

import logging
import math
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse, UnreadablePostError
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response

from anex.errors import DomainError, RateLimited, TimedOut
from anex.logsafe import exception_summary

logger = logging.getLogger(__name__)

API_PREFIXES = ("/batch/", "/realtime/")
# The OpenAI-compatible surface (openai_api): its errors are OpenAI's envelope.
OPENAI_PREFIX = "/openai/"

MISSING_KEY_DETAIL = (
    "Missing API key: send it as 'Authorization: Bearer <your-api-key>' "
    "(or 'x-api-key: <your-api-key>')."
)
INVALID_KEY_DETAIL = "The API key is invalid or no longer active."
RATE_LIMITED_DETAIL = (
    "Too many requests: this API key is sending requests faster than the API accepts. "
    "Wait the seconds in the Retry-After header, then retry."
)
UNAVAILABLE_DETAIL = "A check this request depends on could not run. Retry shortly."
BODY_TIMED_OUT_DETAIL = ("The request body did not arrive in time, so nothing was done. "
                         "Send the whole request at once, then retry.")


class ApiError(Exception):
    """An answer with the reference's status code and message (what the handler makes of
    a DomainError; a view may raise one itself).

    `extra` adds the fields the reference shows beside detail (421's residency and api,
    429's error.code); `retry_after` becomes the Retry-After header.
    """

    def __init__(self, status: int, detail: Any, *, extra: dict[str, Any] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.detail = detail
        self.extra = extra or {}
        self.retry_after = retry_after

    @classmethod
    def of(cls, error: DomainError) -> ApiError:
        """A service's refusal as the API answers it (anex.errors.ANSWERED_WITH)."""
        return cls(error.status, error.detail, extra=error.extra,
                   retry_after=error.retry_after)

    def body(self) -> dict[str, Any]:
        return {"detail": self.detail, **self.extra}


def _flatten(detail: Any, path: str = "") -> list[str]:
    """DRF's nested validation detail as 'field: message' lines."""
    if isinstance(detail, dict):
        lines: list[str] = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            lines += _flatten(value, f"{path}.{name}" if path and name else name or path)
        return lines
    if isinstance(detail, list):
        return [line for item in detail for line in _flatten(item, path)]
    return [f"{path}: {detail}" if path else str(detail)]


def rate_limited(wait: float | None) -> RateLimited:
    """A key past its request rate (DRF's throttle, and the realtime API's own count)."""
    seconds = max(1, math.ceil(wait or 1))
    return RateLimited(RATE_LIMITED_DETAIL, retry_after=seconds, code="rate_limit_exceeded")


def as_api_error(exc: Exception) -> ApiError | None:
    """The answer an exception gets, or None for one no answer is known for (a 500)."""
    if isinstance(exc, ApiError):
        return exc
    if isinstance(exc, DomainError):
        return ApiError.of(exc)
    if isinstance(exc, Http404 | exceptions.NotFound):
        return ApiError(404, "Not found.")
    if isinstance(exc, PermissionDenied):
        return ApiError(403, "You do not have permission to perform this action.")
    if isinstance(exc, exceptions.NotAuthenticated):
        # The reference answers a missing Authorization header with 422: it is a missing
        # part of the request's shape, not a failed credential.
        return ApiError(422, MISSING_KEY_DETAIL)
    if isinstance(exc, exceptions.AuthenticationFailed):
        return ApiError(401, INVALID_KEY_DETAIL)
    if isinstance(exc, exceptions.Throttled):
        return ApiError.of(rate_limited(getattr(exc, "wait", None)))
    if isinstance(exc, exceptions.ParseError):
        return ApiError(400, f"The request body is not valid JSON: {exc.detail}")
    if isinstance(exc, exceptions.UnsupportedMediaType):
        return ApiError(415, "Send the request body as JSON (Content-Type: application/json).")
    if isinstance(exc, exceptions.ValidationError):
        # A missing or wrongly typed body field is 422 in the reference's error table.
        lines = _flatten(exc.detail)
        return ApiError(422, "; ".join(lines), extra={"errors": exc.detail})
    if isinstance(exc, exceptions.APIException):
        return ApiError(exc.status_code, str(exc.detail))
    if isinstance(exc, UnreadablePostError):
        # The body stopped arriving (the web role's socket timeout or body deadline, or a
        # client gone): the client's doing, never a 500.
        return ApiError.of(TimedOut(BODY_TIMED_OUT_DETAIL))
    if isinstance(exc, OperationalError | InterfaceError):
        # The database is unreachable: a retryable 503, never a 500.
        logger.warning("database unavailable: %s", exc.__class__.__name__)
        return ApiError(503, UNAVAILABLE_DETAIL)
    return None


def _headers(error: ApiError) -> dict[str, str]:
    headers = {}
    if error.status in (429, 503):
        retry_after = error.retry_after or settings.ANEX_RETRY_AFTER_SECONDS
        headers["Retry-After"] = str(retry_after)
    return headers


def error_response(error: ApiError) -> Response:
    return Response(error.body(), status=error.status, headers=_headers(error))


def error_json_response(error: DomainError) -> JsonResponse:
    """A refusal answered by a plain Django view (the console's JSON endpoint for an upload
    target) exactly as the API's handler answers it."""
    answer = ApiError.of(error)
    response = JsonResponse(answer.body(), status=answer.status)
    for name, value in _headers(answer).items():
        response[name] = value
    return response


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    error = as_api_error(exc)
    if error is None:
        # The class and place, never the message or a traceback's: a request's body (a
        # realtime prompt, a row) is often quoted in them (anex.logsafe).
        what = "database error" if isinstance(exc, DatabaseError) else "unhandled error"
        logger.error("%s in %s: %s", what, context.get("view"), exception_summary(exc))
        error = ApiError(500, "Internal server error. Retry; if it persists, contact support "
                              "with the X-Anex-Request-ID header of this response.")
    return error_response(error)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def openai_error_type(status: int) -> str:
    """OpenAI's error.type for a status."""
    if status >= 500:
        return "server_error"
    if status == 429:
        return "requests"
    return "invalid_request_error"


def openai_error_body(status: int, message: str, *, code: str | None = None,
                      param: str | None = None) -> dict[str, Any]:
    """OpenAI's error envelope: {"error": {"message", "type", "code", "param"}}."""
    return {"error": {"message": message, "type": openai_error_type(status), "code": code,
                      "param": param}}


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    """URLs no view matched: JSON under the API prefixes, the HTML page elsewhere."""
    if request.path.startswith(OPENAI_PREFIX):
        return JsonResponse(openai_error_body(404, f"Unknown request URL: {request.method} "
                                                   f"{request.path}.",
                                              code="unknown_url"), status=404)
    if _is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if request.path.startswith(OPENAI_PREFIX):
        return JsonResponse(openai_error_body(500, "Internal server error."), status=500)
    if _is_api(request):
        return JsonResponse({"detail": "Internal server error."}, status=500)
    return defaults.server_error(request)
