"""The Django admin site: staff sign in through allauth, and the admin is served on one
host when ANEX_ADMIN_HOST is set (docs/dev/decisions/2026-12-01-other-facts.md)."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial, update_wrapper
from typing import Any, TypeVar, cast

from allauth.account.decorators import secure_admin_login
from allauth.mfa.models import Authenticator
from allauth.mfa.utils import is_mfa_enabled
from django.conf import settings
from django.contrib import messages
from django.contrib.admin import AdminSite
from django.core import checks
from django.http import Http404, HttpRequest, HttpResponse, HttpResponseBase
from django.http.request import split_domain_port
from django.shortcuts import redirect
from django.urls import URLPattern, URLResolver, path

_View = TypeVar("_View", bound=Callable[..., HttpResponseBase])


@checks.register(checks.Tags.security, deploy=True)
def admin_host_check(app_configs: Any, **kwargs: Any) -> list[checks.CheckMessage]:
    """`check --deploy`: the admin served on every host (ANEX_ADMIN_HOST=*) is for one
    machine (`make run`), not a deployment (issue 40 L10)."""
    if settings.ANEX_ADMIN_HOST is not None:
        return []
    return [checks.Warning(
        "The admin is served on every allowed host, the API hosts included.",
        hint="Set ANEX_ADMIN_HOST to a host of its own, such as admin.example.com.",
        id="anex.W001")]


def admin_host_require(request: HttpRequest) -> None:
    """404 unless the request reached the admin host (when one is configured), so the admin
    is not even discoverable on the public API hosts."""
    admin_host = settings.ANEX_ADMIN_HOST
    if admin_host is None:
        return
    host, _port = split_domain_port(request.get_host())
    if host.lower() != admin_host:
        raise Http404("Not found.")


STAFF_MFA_REQUIRED = ("Staff need two-factor authentication to use the admin: set up an "
                      "authenticator app here with the one-time enrolment code a superuser "
                      "gives you in person (manage.py staffenrol), then open the admin again.")


def staff_mfa_missing(request: HttpRequest) -> bool:
    """A signed-in staff user without TOTP (ANEX_STAFF_MFA_REQUIRED): the admin holds every
    organization's data and credits. With TOTP on, allauth's sign-in asks for the code, so
    a session of such a user passed it."""
    user = request.user
    return bool(settings.ANEX_STAFF_MFA_REQUIRED and user.is_authenticated
                and user.is_staff and not is_mfa_enabled(user, [Authenticator.Type.TOTP]))


class AnexAdminSite(AdminSite):
    # The index links the operations page (jobs/admin.py).
    index_template = "admin/anex_index.html"

    def get_urls(self) -> list[URLResolver | URLPattern]:
        from jobs.admin import operations_view

        return [path("operations/", self.admin_view(partial(operations_view, site=self)),
                     name="operations"), *super().get_urls()]

    def admin_view(self, view: _View, cacheable: bool = False) -> _View:
        # Every admin page but login goes through here (ModelAdmin URLs included).
        inner = super().admin_view(view, cacheable)

        def on_admin_host(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponseBase:
            admin_host_require(request)
            if staff_mfa_missing(request):
                messages.warning(request, STAFF_MFA_REQUIRED)
                return redirect("mfa_activate_totp")
            return inner(request, *args, **kwargs)

        return cast(_View, update_wrapper(on_admin_host, inner))

    def login(self, request: HttpRequest, extra_context: dict[str, Any] | None = None
              ) -> HttpResponse:
        admin_host_require(request)
        # The admin's own password form has no rate limit: staff sign in through allauth's
        # login (rate-limited per address and per account, email verified), and a signed-in
        # user who is not staff is refused here.
        response: HttpResponse = secure_admin_login(super().login)(request, extra_context)
        return response
