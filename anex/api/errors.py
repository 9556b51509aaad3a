"""One error type and one handler: every API error body is {"detail": …} (STYLE.md rule 7).

Services raise ApiError with the reference's status and message; the handler below also
maps Django's and DRF's own exceptions onto the same envelope, so a client never sees an
HTML page or a differently shaped body from /batch/v1 or /realtime/v1.
"""

from __future__ import annotations

import logging
from typing import Any

from django.conf import settings
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError, InterfaceError, OperationalError
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults
from rest_framework import exceptions
from rest_framework.response import Response

logger = logging.getLogger(__name__)

API_PREFIXES = ("/batch/", "/realtime/")

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


class ApiError(Exception):
    """An error with the reference's status code and message.

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
    def not_found(cls, noun: str) -> ApiError:
        return cls(404, f"{noun} not found")

    @classmethod
    def unavailable(cls, detail: str = UNAVAILABLE_DETAIL) -> ApiError:
        return cls(503, detail, retry_after=settings.ANEX_RETRY_AFTER_SECONDS)

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


def _as_api_error(exc: Exception) -> ApiError | None:
    if isinstance(exc, ApiError):
        return exc
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
        wait = max(1, int(getattr(exc, "wait", None) or 1))
        return ApiError(
            429, RATE_LIMITED_DETAIL, retry_after=wait,
            extra={"error": {"code": "rate_limit_exceeded", "message": RATE_LIMITED_DETAIL}},
        )
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
    if isinstance(exc, OperationalError | InterfaceError):
        # The database is unreachable: a retryable 503, never a 500.
        logger.warning("database unavailable: %s", exc.__class__.__name__)
        return ApiError.unavailable()
    return None


def error_response(error: ApiError) -> Response:
    headers = {}
    if error.status in (429, 503):
        retry_after = error.retry_after or settings.ANEX_RETRY_AFTER_SECONDS
        headers["Retry-After"] = str(retry_after)
    return Response(error.body(), status=error.status, headers=headers)


def exception_handler(exc: Exception, context: dict[str, Any]) -> Response:
    error = _as_api_error(exc)
    if error is None:
        if isinstance(exc, DatabaseError):
            logger.exception("database error in %s", context.get("view"))
        else:
            logger.exception("unhandled error in %s", context.get("view"))
        error = ApiError(500, "Internal server error. Retry; if it persists, contact support "
                              "with the X-Anex-Request-ID header of this response.")
    return error_response(error)


def _is_api(request: HttpRequest) -> bool:
    return request.path.startswith(API_PREFIXES)


def handler404(request: HttpRequest, exception: Exception) -> HttpResponse:
    """URLs no view matched: JSON under the API prefixes, the HTML page elsewhere."""
    if _is_api(request):
        return JsonResponse({"detail": "Not found."}, status=404)
    return defaults.page_not_found(request, exception)


def handler500(request: HttpRequest) -> HttpResponse:
    if _is_api(request):
        return JsonResponse({"detail": "Internal server error."}, status=500)
    return defaults.server_error(request)
