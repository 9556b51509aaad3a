"""The realtime API's lean middleware path
(docs/dev/decisions/2026-12-02-the-realtime-fast-path.md).

A request under LEAN_PREFIXES carries a bearer key and JSON, never a cookie or a form, so
the middlewares that serve the browser (sessions, CSRF, the signed-in user, messages,
allauth's account context, static files) have nothing to do for it: each would still cost
a layer and its own work per request. LeanApiMiddleware, placed after the request id, the
metrics and the body limit, hands such a request to a second middleware chain built from
the rest of settings.MIDDLEWARE less BROWSER_ONLY, around Django's own view handling
(URL resolution, the view, the response's rendering, exceptions to responses). Every
other path goes on through the full stack unchanged.

The middlewares kept are every one that can change an API answer (the security headers,
the Content-Security-Policy, Content-Length, X-Frame-Options, the slash redirect), in
their settings order, so a realtime answer's status, body and headers are the same either
way (tests/db/test_lean_path.py compares the two). A middleware added to the settings later
is in the lean chain unless it is named in BROWSER_ONLY.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured, MiddlewareNotUsed
from django.core.handlers.base import BaseHandler
from django.core.handlers.exception import convert_exception_to_response
from django.http import HttpRequest, HttpResponseBase
from django.utils.module_loading import import_string

LEAN_PREFIXES = ("/realtime/v1/",)
THIS = "anex.internals.lean.LeanApiMiddleware"
# What a bearer-key JSON request never needs: no cookie, session, form, signed-in user,
# flash message or static file is read or written on its path.
BROWSER_ONLY = frozenset({
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "allauth.account.middleware.AccountMiddleware",
})

Handler = Callable[[HttpRequest], HttpResponseBase]


def lean_middleware(middleware: Sequence[str]) -> list[str]:
    """The middlewares after this one in `middleware`, less the browser's."""
    if THIS not in middleware:
        raise ImproperlyConfigured(f"{THIS} is not in MIDDLEWARE")
    after = list(middleware)[list(middleware).index(THIS) + 1:]
    return [path for path in after if path not in BROWSER_ONLY]


class LeanHandler(BaseHandler):
    """Django's request handling (resolution, view middleware, the view, template
    rendering, exceptions to responses) around the given middlewares only. Synchronous,
    as the web tier is (gunicorn's threads)."""

    def __init__(self, middleware: Sequence[str]) -> None:
        super().__init__()
        self.middleware = tuple(middleware)
        self.load_middleware()

    def load_middleware(self, is_async: bool = False) -> None:
        # BaseHandler.load_middleware reads settings.MIDDLEWARE; this is its synchronous
        # case for another list.
        self._view_middleware: list[Callable[..., Any]] = []
        self._template_response_middleware: list[Callable[..., Any]] = []
        self._exception_middleware: list[Callable[..., Any]] = []
        handler: Any = convert_exception_to_response(
            self._get_response)  # type: ignore[attr-defined]  # not in django-stubs
        for path in reversed(self.middleware):
            middleware = import_string(path)
            if not getattr(middleware, "sync_capable", True):
                raise ImproperlyConfigured(f"{path} cannot run synchronously")
            try:
                instance = middleware(handler)
            except MiddlewareNotUsed:
                continue
            if hasattr(instance, "process_view"):
                self._view_middleware.insert(0, instance.process_view)
            if hasattr(instance, "process_template_response"):
                self._template_response_middleware.append(instance.process_template_response)
            if hasattr(instance, "process_exception"):
                self._exception_middleware.append(instance.process_exception)
            handler = convert_exception_to_response(instance)
        self._middleware_chain = handler

    def chain(self, request: HttpRequest) -> HttpResponseBase:
        """The middlewares and the view (what BaseHandler.get_response wraps: the outer
        handler still closes the request and logs a 4xx or 5xx, once)."""
        response: HttpResponseBase = self._middleware_chain(request)
        return response


class LeanApiMiddleware:
    def __init__(self, get_response: Handler) -> None:
        self.get_response = get_response
        self.lean = LeanHandler(lean_middleware(settings.MIDDLEWARE))

    def __call__(self, request: HttpRequest) -> HttpResponseBase:
        if request.path_info.startswith(LEAN_PREFIXES):
            return self.lean.chain(request)
        return self.get_response(request)
