"""The Content-Security-Policy every response is sent with (issue 22, L5;
docs/dev/decisions/2026-12-02-the-console-hardened.md, "Content-Security-Policy").

Scripts and styles come only from this site's own files: no inline `<script>`, no `on*=`
handler, no `style=` attribute or `<style>` block runs or applies, so an injected tag does
nothing even if the templates' escaping were ever missed. The console's behaviour lives in
static/js/console.js, bound to `data-` attributes.

A page that must reach another origin from its scripts (the New job page uploads the file
straight to the region's storage) names it on its response (`csp_connect_add`); nothing
else widens the policy.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.http import HttpRequest, HttpResponse

HEADER = "Content-Security-Policy"
# The directives, in order. img-src takes data: for the two-factor page's QR code (allauth
# draws it as a data: SVG); form-action is left out because the top-up form's answer is a
# redirect to Stripe's checkout, whose host is Stripe's to choose.
DIRECTIVES: dict[str, tuple[str, ...]] = {
    "default-src": ("'self'",),
    "script-src": ("'self'",),
    "style-src": ("'self'",),
    "img-src": ("'self'", "data:"),
    "font-src": ("'self'",),
    "connect-src": ("'self'",),
    "object-src": ("'none'",),
    "base-uri": ("'none'",),
    "frame-ancestors": ("'none'",),
}
_EXTRA_CONNECT = "_anex_csp_connect"


def csp_connect_add(response: HttpResponse, origins: Iterable[str]) -> HttpResponse:
    """Let this response's scripts also connect to `origins` (scheme://host[:port])."""
    setattr(response, _EXTRA_CONNECT, (*getattr(response, _EXTRA_CONNECT, ()), *origins))
    return response


def policy(extra_connect: Iterable[str] = ()) -> str:
    directives = dict(DIRECTIVES)
    extra = tuple(origin for origin in extra_connect if origin not in directives["connect-src"])
    directives["connect-src"] = (*directives["connect-src"], *dict.fromkeys(extra))
    return "; ".join(f"{name} {' '.join(sources)}" for name, sources in directives.items())


class ContentSecurityPolicyMiddleware:
    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        response = self.get_response(request)
        if HEADER not in response:
            response[HEADER] = policy(getattr(response, _EXTRA_CONNECT, ()))
        return response
