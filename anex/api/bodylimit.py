"""One size limit for every request body sent to /batch/ and /realtime/ (docs/decisions.md,
"Submitting a job: what is answered when").

Django's DATA_UPLOAD_MAX_MEMORY_SIZE guards only request.body and form parsing; DRF's
parsers read request.stream, which Django bounds by the declared Content-Length and by
nothing else. So the declared length is judged here, before any view or parser runs, and a
body over the limit is answered 413 in the API's envelope without a byte of it being read.
A body with no Content-Length reads as empty (Django's LimitedStream), so the declared
length is the whole of what can be read.

The same bodies must also arrive within ANEX_API_BODY_SECONDS (issue 40 M2): under the web
role every read of the connection is bounded by that deadline (anex.gunicorn_hooks), so a
client that trickles its body cannot hold a thread for longer; a read past it fails
(UnreadablePostError), answered 408. The OpenAI file upload streams up to 2 GiB and is
bounded by the socket timeout per read and the transfer caps instead (anex.transfers).
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError

from anex.api.errors import API_PREFIXES, BODY_TIMED_OUT_DETAIL, OPENAI_PREFIX, openai_error_body
from anex.errors import TimedOut

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
        refused = self._refusal(request)
        if refused is not None:
            return refused
        if request.path.startswith((*API_PREFIXES, OPENAI_PREFIX)) \
                and request.path != OPENAI_FILES_PATH:
            with body_deadline(request, settings.ANEX_API_BODY_SECONDS):
                return self.get_response(request)
        return self.get_response(request)

    def _refusal(self, request: HttpRequest) -> HttpResponse | None:
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
        return None


@contextmanager
def body_deadline(request: HttpRequest, seconds: float) -> Iterator[None]:
    """Every read of this request's connection within `seconds` from now, for the block:
    the web role's connections take a deadline (anex.gunicorn_hooks.BoundedSocket); another
    server's (the test client's) are left as they are."""
    connection = request.META.get("gunicorn.socket")
    deadline_set = getattr(connection, "deadline_set", None)
    if deadline_set is None:
        yield
        return
    deadline_set(time.monotonic() + seconds)
    try:
        yield
    finally:
        deadline_set(None)


def body_read(request: HttpRequest) -> None:
    """Read the request's whole body now (within its deadline, body_deadline), so that what
    follows holds nothing while a client sends: TimedOut (408) when it stops arriving. DRF
    then parses the bytes read (request.body), as Django keeps them."""
    try:
        body = request.read()
    except UnreadablePostError:
        raise TimedOut(BODY_TIMED_OUT_DETAIL) from None
    # What HttpRequest.body keeps once read, without its DATA_UPLOAD_MAX_MEMORY_SIZE check
    # (2.5 MB; this body is within the API's own limit, judged above before a byte was read).
    request._body = body  # type: ignore[attr-defined]
    request._stream = io.BytesIO(body)  # type: ignore[attr-defined]


def _declared_length(request: HttpRequest) -> int:
    try:
        return int(request.META.get("CONTENT_LENGTH") or 0)
    except ValueError:
        return 0  # Django reads an unparsable length as no body at all
