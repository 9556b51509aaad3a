"""Settings (owners), members and invitations, the audit log (owners), and switching
between the user's organizations."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from allauth.account.decorators import reauthentication_required
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.contrib.auth.models import User
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from anex.errors import NotFound
from console.constants import Role
from console.forms import InviteForm, OrganizationNameForm, SpendLimitForm, WebhookForm
from console.models import Membership
from console.selectors import (
    audit_event_list,
    invitation_get,
    invitation_open_list,
    member_spend_committed,
    membership_current,
    membership_get,
    organization_has_webhook_secret,
    organization_member_list,
    organization_webhook_secret,
)
from console.services import (
    invitation_accept,
    invitation_create,
    invitation_for_token,
    invitation_revoke,
    membership_remove,
    membership_role_set,
    membership_spend_limit_set,
    organization_update,
)
from console.views.base import SESSION_ORGANIZATION, Console, console_page, fragment, page
from jobs.constants import DeliveryStatus
from jobs.selectors import webhook_delivery_get, webhook_delivery_list
from jobs.services.webhook_endpoint import (
    organization_webhook_secret_rotate,
    organization_webhook_set,
    organization_webhook_test,
)

DELIVERIES_SHOWN = 20
# The Settings actions that ask for a recent re-authentication (allauth's;
# docs/dev/decisions/2026-12-02-the-console-hardened.md and
# docs/dev/decisions/2026-12-06-owners-actions-re-authenticated-and-mailed.md): those that show or
# replace the signing secret, and the one that moves where job events go. Turning auto-approve on
# asks too (every estimate then spends unattended); turning it off spends nothing and does not.
SENSITIVE_SETTINGS = frozenset({"reveal", "rotate", "rotate_now", "webhook"})


def _sensitive_setting(request: HttpRequest) -> bool:
    action = request.POST.get("action")
    return request.method == "POST" and (
        action in SENSITIVE_SETTINGS
        or (action == "auto_approve" and request.POST.get("auto_approve") == "on"))


# The Members page's actions that ask for one: those that make an owner, change a role,
# remove someone, or set what a member may spend. An invitation as a member, and revoking
# an invitation, give no one more than they had and do not.
SENSITIVE_MEMBER_ACTIONS = frozenset({"remove", "role", "spend_limit"})


def _sensitive_member_action(request: HttpRequest) -> bool:
    action = request.POST.get("action", "invite")
    return request.method == "POST" and (
        action in SENSITIVE_MEMBER_ACTIONS
        or (action == "invite" and request.POST.get("role") == Role.OWNER))


@require_http_methods(["GET", "POST"])
@console_page(owner=True)
@reauthentication_required(enabled=_sensitive_setting)
def settings_page(request: HttpRequest, console: Console) -> HttpResponse:
    organization = console.organization
    secret = None
    webhook_form = WebhookForm(initial={"webhook_url": organization.webhook_url})
    name_form = OrganizationNameForm(initial={"name": organization.name})
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "webhook":
            webhook_form = WebhookForm(request.POST)
            if webhook_form.is_valid():
                try:
                    organization_webhook_set(organization=organization, actor=console.actor,
                                             url=webhook_form.cleaned_data["webhook_url"])
                except ValidationError as error:
                    webhook_form.add_error("webhook_url", error)
                else:
                    messages.success(request, "Webhook endpoint saved.")
                    return redirect("console-settings")
        elif action == "reveal":
            # Shown in this one response (no-store, below), never in the page a GET answers.
            secret = organization_webhook_secret(organization=organization)
        elif action in ("rotate", "rotate_now"):
            grace = action == "rotate"
            organization_webhook_secret_rotate(organization=organization, actor=console.actor,
                                               grace=grace)
            messages.success(request, "A new signing secret is in use. " + (
                "The previous one keeps signing beside it for 24 hours." if grace else
                "The previous one stopped signing now: deliveries verify only with the new "
                "one."))
            return redirect("console-settings")
        elif action == "test":
            delivery = organization_webhook_test(organization=organization, actor=console.actor)
            return redirect(f"{reverse('console-settings')}?delivery={delivery.pk}#test")
        elif action == "auto_approve":
            enabled = request.POST.get("auto_approve") == "on"
            organization_update(organization=organization, actor=console.actor,
                                auto_approve=enabled)
            messages.success(request, "Auto-approve is on: every estimate is approved as it "
                                      "arrives." if enabled else "Auto-approve is off.")
            return redirect("console-settings")
        elif action == "progress_webhooks":
            enabled = request.POST.get("progress_webhooks") == "on"
            organization_update(organization=organization, actor=console.actor,
                                progress_webhooks=enabled)
            messages.success(request, "Progress events are on: a running job sends one at "
                                      "25, 50 and 75 % of its rows." if enabled else
                             "Progress events are off.")
            return redirect("console-settings")
        elif action == "name":
            name_form = OrganizationNameForm(request.POST)
            if name_form.is_valid():
                organization_update(organization=organization, actor=console.actor,
                                    name=name_form.cleaned_data["name"])
                messages.success(request, "Organization renamed.")
                return redirect("console-settings")
        else:
            messages.error(request, "Unknown settings action.")
    tested = None
    if request.GET.get("delivery"):
        try:
            tested = webhook_delivery_get(organization=organization,
                                          id=request.GET["delivery"])
        except NotFound:  # a stale or another organization's id just shows nothing
            tested = None
    context = {
        "webhook_form": webhook_form, "name_form": name_form,
        "has_secret": organization_has_webhook_secret(organization=organization),
        "secret": secret,
        "deliveries": webhook_delivery_list(organization=organization)[:DELIVERIES_SHOWN],
        "tested": tested,
        "live": tested is not None and tested.status == DeliveryStatus.PENDING,
        "poll_ms": 1500,
    }
    if request.GET.get("fragment"):
        return fragment(request, "console/_deliveries.html", context)
    response = page(request, console, "console/settings.html", "settings", **context)
    # The signing secret is in the page after "Reveal": no cache may keep a copy (nor of
    # the page without it, which a POST and a GET share).
    response["Cache-Control"] = "no-store"
    return response


@require_http_methods(["GET", "POST"])
@console_page()
def members_page(request: HttpRequest, console: Console) -> HttpResponse:
    action = request.POST.get("action", "invite")
    # Bound only to an invitation's POST: a bound empty form on GET would show its role
    # select with no choice made (the browser's first, owner) and "required" errors.
    form = InviteForm(request.POST if request.method == "POST" and action == "invite"
                      else None)
    if request.method == "POST":
        # Refused before re-authentication: a member is not asked for their password for
        # what they may not do anyway (the services refuse them too).
        if not console.is_owner:
            raise PermissionDenied(f"Only an owner of {console.organization.name} can invite "
                                   "and manage members.")
        done = _owner_action(request, console, action, form)
        if done is not None:
            return done
    return page(request, console, "console/members.html", "members", form=form,
                members=[_member_row(console, m) for m in organization_member_list(
                    organization=console.organization)],
                invitations=invitation_open_list(organization=console.organization))


@reauthentication_required(enabled=_sensitive_member_action)
def _owner_action(request: HttpRequest, console: Console, action: str,
                  form: InviteForm) -> HttpResponse | None:
    """An owner's POST of the Members page; None to show the page again with the
    invitation form's errors."""
    if action != "invite":
        return _member_action(request, console, action)
    if form.is_valid():
        try:
            invitation_create(
                organization=console.organization, actor=console.actor,
                email=form.cleaned_data["email"], role=Role(form.cleaned_data["role"]),
                accept_url=lambda token: request.build_absolute_uri(
                    reverse("console-invitation", args=[token])))
        except ValidationError as error:
            form.add_error("email", error)
        else:
            messages.success(request, f"Invitation sent to {form.cleaned_data['email']}.")
            return redirect("console-members")
    return None


@dataclass(frozen=True)
class MemberRow:
    """A row of the Members page: the membership, and for an owner's view of a member what
    their spending already takes of their limit (None: a key without a budget)."""

    membership: Membership
    committed: int | None = None

    @property
    def limit_dollars(self) -> str:
        """The limit as the form's number field shows it; empty for none."""
        cents = self.membership.spend_limit_cents
        return "" if cents is None else f"{cents / 100:.2f}"


def _member_row(console: Console, membership: Membership) -> MemberRow:
    if not console.is_owner or membership.role != Role.MEMBER:
        return MemberRow(membership)
    return MemberRow(membership, member_spend_committed(organization=console.organization,
                                                        user=membership.user))


def _member_action(request: HttpRequest, console: Console, action: str) -> HttpResponse:
    """The Members page's owner actions: remove a member (optionally revoking the keys they
    created), change a role, set a member's spending limit, revoke an invitation. The
    services refuse a member."""
    organization, actor = console.organization, console.actor
    if action == "remove":
        membership = membership_get(organization=organization, id=request.POST.get("member", ""))
        revoked = membership_remove(membership=membership, actor=actor,
                                    revoke_keys=request.POST.get("revoke_keys") == "on")
        messages.success(request, f"Removed {membership.user.email}"
                         + (f" and revoked {len(revoked)} of their keys." if revoked else "."))
    elif action == "role":
        membership = membership_get(organization=organization, id=request.POST.get("member", ""))
        role = request.POST.get("role", "")
        if role not in Role.values:
            raise ValidationError("Pick owner or member.")
        membership_role_set(membership=membership, actor=actor, role=Role(role))
        messages.success(request, f"{membership.user.email} is now {Role(role).label.lower()}.")
    elif action == "spend_limit":
        limit = SpendLimitForm(request.POST)
        if not limit.is_valid():
            raise ValidationError("Enter a spending limit in dollars, such as 50 or 12.50, or "
                                  "leave it empty for no limit.")
        membership = membership_get(organization=organization,
                                    id=limit.cleaned_data["member"])
        cents = limit.spend_limit_cents
        membership_spend_limit_set(membership=membership, actor=actor, cents=cents)
        messages.success(request, f"{membership.user.email} now has "
                         + (f"a spending limit of ${cents / 100:,.2f}." if cents is not None
                            else "no spending limit."))
    elif action == "revoke_invitation":
        invitation = invitation_get(organization=organization,
                                    id=request.POST.get("invitation", ""))
        invitation_revoke(invitation=invitation, actor=actor)
        messages.success(request, f"Invitation to {invitation.email} revoked.")
    else:
        messages.error(request, "Unknown members action.")
    return redirect("console-members")


# An invitation's token, kept in the session while its invitee signs in or up: the sign-in
# page's ?next= then names the token-less page (console-invitation-pending).
SESSION_INVITATION = "anex_invitation_token"


@require_http_methods(["GET", "POST"])
def invitation_page(request: HttpRequest, token: str) -> HttpResponse:
    """The link in an invitation mail: accept it signed in with the invited address. A
    visitor not signed in is sent to sign in with the token in the session, not in ?next=
    (the link's path is masked in the logs, anex.logmask)."""
    if not request.user.is_authenticated:
        if invitation_for_token(token) is None:
            raise Http404("This invitation has been used, has expired, or never existed.")
        request.session[SESSION_INVITATION] = token
        return redirect_to_login(reverse("console-invitation-pending"))
    return _invitation(request, token)


@require_http_methods(["GET", "POST"])
@login_required
def invitation_pending_page(request: HttpRequest) -> HttpResponse:
    """The invitation whose link was opened before signing in (its token in the session)."""
    token = request.session.get(SESSION_INVITATION)
    if not isinstance(token, str):
        raise Http404("No invitation is waiting: open the link in the invitation mail.")
    return _invitation(request, token)


def _invitation(request: HttpRequest, token: str) -> HttpResponse:
    invitation = invitation_for_token(token)
    if invitation is None:
        request.session.pop(SESSION_INVITATION, None)
        raise Http404("This invitation has been used, has expired, or never existed.")
    user = cast(User, request.user)
    if request.method == "POST":
        try:
            membership = invitation_accept(invitation=invitation, user=user)
        except (PermissionDenied, ValidationError) as error:
            messages.error(request, str(error.messages[0] if isinstance(error, ValidationError)
                                        else error))
            return redirect(request.path)
        request.session.pop(SESSION_INVITATION, None)
        request.session[SESSION_ORGANIZATION] = str(membership.organization_id)
        messages.success(request, f"You joined {membership.organization.name}.")
        return redirect("console-jobs")
    return render(request, "console/invitation.html", {
        "invitation": invitation,
        "memberships": [],
        "current": membership_current(user=user),
    })


@require_POST
@login_required
def organization_switch(request: HttpRequest) -> HttpResponse:
    """Act in another of the user's organizations; one that is not theirs is a 404."""
    wanted = request.POST.get("organization", "")
    membership = membership_current(user=cast(User, request.user), organization_id=wanted)
    if membership is None or str(membership.organization_id) != wanted:
        raise Http404("Not one of your organizations.")
    request.session[SESSION_ORGANIZATION] = wanted
    return redirect("console-jobs")


@require_GET
@console_page(owner=True)
def audit_page(request: HttpRequest, console: Console) -> HttpResponse:
    events = Paginator(audit_event_list(organization=console.organization), 50)
    return page(request, console, "console/audit.html", "audit",
                page_obj=events.get_page(request.GET.get("page")))
