"""No id, cursor or other URL value of this product holds a NUL character (U+0000), and
PostgreSQL's text cannot store one: a lookup handed one raises psycopg's DataError, which
was a 500 wherever a view passed the value on unparsed (the OpenAI surface's ids and
cursors, its purpose filter, the admin's object ids and searches). So a request whose
path or query string carries one is answered here, before any view, on every surface
(docs/dev/decisions/2026-12-06-a-nul-character-in-a-url.md): 404 for the path, which names nothing
that can exist, the surface's own not-found answer (anex.api.errors.handler404); 400 for
a query parameter, naming it, in the surface's envelope."""

from __future__ import annotations

from collections.abc import Callable

from django.core.exceptions import BadRequest
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views import defaults

from anex.api.errors import API_PREFIXES, OPENAI_PREFIX, handler404, openai_error_body

NUL = "\x00"
# A NUL reaches a query string as %00 (or, from a careless server, as itself).
_ENCODED = "%00"


def nul_query_detail(name: str | None) -> str:
    where = f"The query parameter {name!r}" if name is not None else "The query string"
    return f"{where} holds a NUL character (U+0000), which no value here may contain."


class NulRefusalMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        if NUL in request.path_info:
            return handler404(request, Http404("A path with a NUL character names nothing."))
        query = request.META.get("QUERY_STRING", "")
        if _ENCODED in query or NUL in query:
            return _query_refused(request)
        return self.get_response(request)


def _query_refused(request: HttpRequest) -> HttpResponse:
    name = next((key for key, values in request.GET.lists()
                 if NUL in key or any(NUL in value for value in values)), None)
    detail = nul_query_detail(name)
    if request.path.startswith(OPENAI_PREFIX):
        return JsonResponse(openai_error_body(400, detail, param=name), status=400)
    if request.path.startswith(API_PREFIXES):
        return JsonResponse({"detail": detail}, status=400)
    return defaults.bad_request(request, BadRequest(detail))
