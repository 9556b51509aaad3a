"""What every console page shares: the signed-in user's current organization and role,
the owner-only guard, and how a service's refusal reads on a page."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import wraps
from typing import Any, Concatenate, ParamSpec, cast

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.core.exceptions import PermissionDenied, ValidationError
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme

from anex.errors import DomainError
from anex.redis import window_hit
from console.actors import Actor
from console.constants import Role
from console.models import Membership, Organization
from console.selectors import membership_current, membership_list
from console.templatetags.console_tags import FORM_ORGANIZATION

# The organization the user is acting in, kept in their session; switching only changes
# which of their own memberships is used (console.selectors.membership_current).
SESSION_ORGANIZATION = "console_organization"
P = ParamSpec("P")


@dataclass(frozen=True)
class Console:
    """Who is acting, and for which organization."""

    membership: Membership

    @property
    def organization(self) -> Organization:
        return self.membership.organization

    @property
    def user(self) -> User:
        return self.membership.user

    @property
    def is_owner(self) -> bool:
        return self.membership.role == Role.OWNER

    @property
    def actor(self) -> Actor:
        return Actor(user=self.membership.user)


CONSOLE_ACTIONS_LIMITED = ("Too many actions: the console takes {limit} a minute from one "
                           "person. Wait a minute, then try again.")


ANOTHER_ORGANIZATION = ("Nothing was done: that page was opened for another organization "
                        "than the one you now act in, {name} (you switched in another tab or "
                        "window). Check this page and try again.")


def console_action_allowed(user: User) -> bool:
    """One more console action (a POST) by this user this minute, within
    ANEX_CONSOLE_ACTIONS_PER_MINUTE. Fails open when Redis is down
    (docs/dev/decisions/2026-12-02-limiters-when-redis-fails.md): every action has its own bound
    besides."""
    hit = window_hit("console-actions", user.pk, fail="open")
    return hit is None or hit.count <= settings.ANEX_CONSOLE_ACTIONS_PER_MINUTE


ConsoleView = Callable[Concatenate[HttpRequest, Console, P], HttpResponse]


def console_page(*, owner: bool = False) -> Callable[[ConsoleView[P]],
                                                   Callable[Concatenate[HttpRequest, P],
                                                            HttpResponse]]:
    """A signed-in page acting for the user's current organization. owner=True refuses a
    member with 403. A service's refusal (anex.errors) reads as the API would say it: one
    the API answers 404 is the page's 404 (another organization's id included), anything
    else a message on the page the user came from.

    A POST must carry the organization its form was rendered for (the hidden field of
    console_tags.organization_field): one rendered for another organization than the
    session's current one (switched in another tab) is refused with nothing done."""

    def decorate(view: ConsoleView[P]) -> Callable[Concatenate[HttpRequest, P], HttpResponse]:
        @login_required
        @wraps(view)
        def wrapper(request: HttpRequest, *args: P.args, **kwargs: P.kwargs) -> HttpResponse:
            user = cast(User, request.user)
            membership = membership_current(
                user=user, organization_id=request.session.get(SESSION_ORGANIZATION))
            if membership is None:
                return render(request, "console/no_organization.html", status=200)
            console = Console(membership=membership)
            if request.method == "POST" and not console_action_allowed(user):
                messages.error(request, CONSOLE_ACTIONS_LIMITED.format(
                    limit=settings.ANEX_CONSOLE_ACTIONS_PER_MINUTE))
                return redirect(back(request))
            if (request.method == "POST"
                    and request.POST.get(FORM_ORGANIZATION) != str(console.organization.pk)):
                messages.error(request, ANOTHER_ORGANIZATION.format(
                    name=console.organization.name))
                return redirect(back(request))
            if owner and not console.is_owner:
                raise PermissionDenied(f"Only an owner of {console.organization.name} can "
                                       "open this page.")
            try:
                return view(request, console, *args, **kwargs)
            except DomainError as error:
                if error.status == 404:
                    raise Http404(error.detail) from None
                messages.error(request, error.detail)
            except ValidationError as error:
                messages.error(request, " ".join(error.messages))
            return redirect(back(request))

        return cast(Callable[Concatenate[HttpRequest, P], HttpResponse], wrapper)

    return decorate


def back(request: HttpRequest, fallback: str = "console-jobs") -> str:
    """Where a refused action returns to: the page the form was on (same site only)."""
    referer = request.headers.get("Referer", "")
    if referer and url_has_allowed_host_and_scheme(
            referer, allowed_hosts={request.get_host()}, require_https=request.is_secure()):
        return referer
    return fallback


def page(request: HttpRequest, console: Console, template: str, section: str,
         **context: Any) -> HttpResponse:
    """Render a console page with the navigation's context."""
    return render(request, template, {
        "console": console,
        "organization": console.organization,
        "is_owner": console.is_owner,
        "memberships": membership_list(user=console.user),
        "section": section,
        **context,
    })


def fragment(request: HttpRequest, template: str, context: dict[str, Any]) -> HttpResponse:
    """The live part of a page, for its poller (static/js/console.js): X-Console-Live says
    whether anything on it is still moving, so the poller knows when to stop."""
    response = render(request, template, context)
    response["X-Console-Live"] = "1" if context.get("live") else "0"
    response["Cache-Control"] = "no-store"
    return response
