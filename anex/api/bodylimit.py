"""The size of every request body sent to /batch/, /realtime/ and /openai/, per endpoint
(docs/dev/decisions/2026-12-01-submitting-a-job-what-is-answered-when.md and
docs/dev/decisions/2026-12-06-request-bodies-each-endpoints-largest-valid-one.md).

Each JSON endpoint takes a body up to what its largest valid request needs, in two
measures: bytes, and items (the values and keys its JSON holds, each of which parsing
makes an object of). Django's DATA_UPLOAD_MAX_MEMORY_SIZE guards only request.body and
form parsing, and says nothing of what the bytes become once parsed: 26 MiB of `{},` is
nine million dicts, some 650 MB. So the declared length is judged here, before any view or
parser runs, and a body over its endpoint's bytes is answered 413 in its API's envelope
without a byte of it being read; the items (and the nesting) are counted by the API's JSON
parser (anex/api/parsers.py) from the text before a single object is made. A body with no
Content-Length reads as empty (Django's LimitedStream), so the declared length is the
whole of what can be read.

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
from dataclasses import dataclass
from functools import cache

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse, UnreadablePostError

from anex.api.errors import API_PREFIXES, BODY_TIMED_OUT_DETAIL, OPENAI_PREFIX, openai_error_body
from anex.errors import TimedOut
from anex.multipart import FORM_OVERHEAD_BYTES
from inference.catalog import catalog_all
from inference.kinds import kind_for
from inference.kinds.decide import DEFAULT_OPTION_BUDGET, DecideKind
from inference.kinds.embed import REALTIME_MAX_INPUTS
from inference.response_format import MAX_BYTES as RESPONSE_FORMAT_MAX_BYTES

# Its character limits (2,097,152 in all, answered 400) need a larger body than the rest.
REALTIME_EMBEDDINGS_PATH = "/realtime/v1/embeddings"
REALTIME_DECISIONS_PATH = "/realtime/v1/systemone"
# A submit and a preflight check take the same body: a job's fields and its response_format.
SUBMIT_PATHS = ("/batch/v1/jobs", "/batch/v1/checks")
# The OpenAI surface's file upload: an input file streamed to storage (openai_api.api),
# up to the input cap and its form's framing (anex.multipart); the surface's other bodies
# are small.
OPENAI_FILES_PATH = "/openai/v1/files"

# Every other body is a few short fields: an input's source_url (8,192 characters) and
# callback_url (2,000), an OpenAI batch's metadata (16 pairs of 64 + 512), a re-run's
# outcomes, at most 12 bytes a character in JSON's escapes: 123 KB at most.
SMALL_BODY_BYTES = 128 * 1024
# The fields beside a body's large part (a job's options, an embedding request's model,
# dimensions, encoding_format and user), as items: keys and values, generously.
FIELD_ITEMS = 64
# Items are cheap (a few hundred bytes each at most, and a body's bytes bound its strings):
# each endpoint takes twice what its largest valid request holds, and at least this many,
# so that a request near a limit is answered by the reference's own check of it (a 400
# naming the limit), and only one far past it by the 413 here.
MIN_ITEMS = 4096


@dataclass(frozen=True)
class BodyLimit:
    """What one endpoint's largest valid JSON body needs: its bytes, and its items (each
    value and each key its JSON holds)."""

    bytes: int
    items: int


def body_limit(path: str) -> BodyLimit:
    """The body an endpoint under /batch/, /realtime/ or /openai/ takes (a JSON one; the
    OpenAI upload, a form, is the middleware's own case). ANEX_API_MAX_BODY_BYTES is the
    operator's ceiling over every one but realtime embeddings, which has its own."""
    ceiling = settings.ANEX_API_MAX_BODY_BYTES
    if path == REALTIME_EMBEDDINGS_PATH:
        # 2,097,152 characters, up to 12 bytes each in JSON (an escaped surrogate pair);
        # at most 128 inputs and the fields beside them.
        return BodyLimit(settings.ANEX_REALTIME_EMBEDDINGS_MAX_BODY_BYTES,
                         _items(REALTIME_MAX_INPUTS + FIELD_ITEMS))
    if path in SUBMIT_PATHS:
        # A response_format of at most 64 KiB as compact JSON holds at most one item per
        # byte (each but the first follows a `[`, `{`, `,` or `:` of its own); written
        # with escapes and indentation it may take many more bytes: the ceiling.
        return BodyLimit(ceiling, _items(RESPONSE_FORMAT_MAX_BYTES + FIELD_ITEMS))
    if path == REALTIME_DECISIONS_PATH:
        # A text of at most 50,000 characters and 64 questions, whose instructions the
        # reference leaves unbounded: the ceiling.
        return BodyLimit(ceiling, _items(_decision_items()))
    return BodyLimit(min(SMALL_BODY_BYTES, ceiling), _items(FIELD_ITEMS))


def _items(largest_valid: int) -> int:
    return max(MIN_ITEMS, 2 * largest_valid)


@cache
def _decision_items() -> int:
    """The items of the largest valid realtime decision: a state object's (one per
    character of its rendering at most, which max_state_chars bounds) and its questions'
    (each a type, instructions and criteria; a criteria's options at most one per token of
    the option budget, since a set that cannot give each option a token is refused)."""
    largest = 0
    for model in catalog_all().values():
        if not isinstance(kind_for(model), DecideKind) \
                or model.price.realtime_input_per_mtok is None:
            continue
        options = model.option_budget_tokens or DEFAULT_OPTION_BUDGET
        per_question = 8 + 2 * options
        largest = max(largest, (model.max_state_chars or 0) + 1
                      + (model.max_questions or 0) * per_question)
    return largest + FIELD_ITEMS


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
            limit = body_limit(request.path).bytes
            declared = _declared_length(request)
            if declared > limit:
                # No Connection header (hop-by-hop, which WSGI forbids an application to
                # set): the server discards or drains the unread body itself.
                return JsonResponse({"detail": body_too_large_detail(declared, limit)},
                                    status=413)
        elif request.path.startswith(OPENAI_PREFIX):
            limit = (settings.ANEX_INPUT_MAX_BYTES + FORM_OVERHEAD_BYTES
                     if request.path == OPENAI_FILES_PATH else body_limit(request.path).bytes)
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
