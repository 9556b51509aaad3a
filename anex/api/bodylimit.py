"""One size limit for every request body sent to /batch/ and /realtime/ (docs/decisions.md,
"Submitting a job: what is answered when").

Django's DATA_UPLOAD_MAX_MEMORY_SIZE guards only request.body and form parsing; DRF's
parsers read request.stream, which Django bounds by the declared Content-Length and by
nothing else. So the declared length is judged here, before any view or parser runs, and a
body over the limit is answered 413 in the API's envelope without a byte of it being read.
A body with no Content-Length reads as empty (Django's LimitedStream), so the declared
length is the whole of what can be read.
"""

from __future__ import annotations

from collections.abc import Callable

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse

from anex.api.errors import API_PREFIXES, OPENAI_PREFIX, openai_error_body

# Its character limits (2,097,152 in all, answered 400) need a larger body than the rest.
REALTIME_EMBEDDINGS_PATH = "/realtime/v1/embeddings"
# The OpenAI surface's file upload: an input file streamed to storage (openai_api.api),
# up to the input cap and its form's framing; the surface's other bodies take the limit.
OPENAI_FILES_PATH = "/openai/v1/files"
FORM_OVERHEAD_BYTES = 64 * 1024


def body_too_large_detail(declared: int, limit: int) -> str:
    return (f"The request body is {declared:,} bytes, over the {limit:,}-byte limit of this "
            "API. Send a smaller request; an input file goes to its upload URL, not here.")


class ApiBodyLimitMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if request.path.startswith(API_PREFIXES):
            limit = (settings.ANEX_REALTIME_EMBEDDINGS_MAX_BODY_BYTES
                     if request.path == REALTIME_EMBEDDINGS_PATH
                     else settings.ANEX_API_MAX_BODY_BYTES)
            declared = _declared_length(request)
            if declared > limit:
                # No Connection header (hop-by-hop, which WSGI forbids an application to
                # set): the server discards or drains the unread body itself.
                return JsonResponse({"detail": body_too_large_detail(declared, limit)},
                                    status=413)
        elif request.path.startswith(OPENAI_PREFIX):
            limit = (settings.ANEX_INPUT_MAX_BYTES + FORM_OVERHEAD_BYTES
                     if request.path == OPENAI_FILES_PATH else settings.ANEX_API_MAX_BODY_BYTES)
            declared = _declared_length(request)
            if declared > limit:
                return JsonResponse(openai_error_body(
                    413, body_too_large_detail(declared, limit).replace(
                        "an input file goes to its upload URL, not here",
                        "an input file goes to POST /openai/v1/files")), status=413)
        return self.get_response(request)


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0  # Django reads an unparsable length as no body at all
