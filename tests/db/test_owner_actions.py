"""Issue 40 L1: the owner actions that move an organization's data or money elsewhere ask
for a recent re-authentication (allauth's), as revealing the signing secret and creating a
key already did: changing the webhook endpoint, turning auto-approve on, inviting an owner,
changing a role, removing someone, setting a member's spending limit. A stale session is
sent to re-authenticate and nothing changes; a recent one proceeds. The owners are mailed
when the endpoint changes and when someone is invited as, or becomes, an owner."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from allauth.account import app_settings as allauth_settings
from allauth.account.models import EmailAddress
from django.core import mail
from django.test import Client

from console.actors import Actor
from console.constants import Role
from console.models import Invitation, Membership, Organization
from console.services import membership_role_set
from jobs.services.webhook_endpoint import organization_webhook_set
from tests.db.test_console import form, signed_in
from tests.db.test_console_hardening import age_reauthentication
from tests.factories import SYSTEM, user_make

pytestmark = pytest.mark.django_db
SETTINGS = "/console/settings"
MEMBERS = "/console/members"
ENDPOINT = "https://93.184.215.14/hook/secret-path-token"  # a public literal: no lookup
ELSEWHERE = "https://93.184.215.15/theirs/another-token"


@dataclass
class Team:
    """An organization with an endpoint, an owner besides the acting ones, and a member."""

    organization: Organization
    second_owner: Membership
    member: Membership


@pytest.fixture
def team(organization: Organization) -> Team:
    organization_webhook_set(organization=organization, actor=SYSTEM, url=ENDPOINT)
    second = user_make(organization, role=Role.OWNER)
    member = user_make(organization, role=Role.MEMBER)
    return Team(organization, Membership.objects.get(user=second),
                Membership.objects.get(user=member))


# Each action: the path, its fields, and whether it was done.
ACTIONS: dict[str, tuple[str, Callable[[Team], dict[str, Any]], Callable[[Team], bool]]] = {
    "change the webhook endpoint": (
        SETTINGS, lambda t: {"action": "webhook", "webhook_url": ELSEWHERE},
        lambda t: Organization.objects.get(pk=t.organization.pk).webhook_url == ELSEWHERE),
    "turn auto-approve on": (
        SETTINGS, lambda t: {"action": "auto_approve", "auto_approve": "on"},
        lambda t: Organization.objects.get(pk=t.organization.pk).auto_approve),
    "invite an owner": (
        MEMBERS, lambda t: {"action": "invite", "email": "new@example.com", "role": "owner"},
        lambda t: Invitation.objects.filter(organization=t.organization).exists()),
    "make a member an owner": (
        MEMBERS, lambda t: {"action": "role", "member": t.member.pk, "role": "owner"},
        lambda t: Membership.objects.get(pk=t.member.pk).role == Role.OWNER),
    "make an owner a member": (
        MEMBERS, lambda t: {"action": "role", "member": t.second_owner.pk, "role": "member"},
        lambda t: Membership.objects.get(pk=t.second_owner.pk).role == Role.MEMBER),
    "remove someone": (
        MEMBERS, lambda t: {"action": "remove", "member": t.member.pk},
        lambda t: not Membership.objects.filter(pk=t.member.pk).exists()),
    "set a member's spending limit": (
        MEMBERS, lambda t: {"action": "spend_limit", "member": t.member.pk, "spend_limit": "5"},
        lambda t: Membership.objects.get(pk=t.member.pk).spend_limit_cents == 500),
}


@pytest.mark.parametrize("what", list(ACTIONS))
def test_a_stale_session_is_asked_to_reauthenticate_and_nothing_changes(
        team: Team, what: str) -> None:
    path, fields, done = ACTIONS[what]
    organization = team.organization
    never, _ = signed_in(organization)  # signed in long ago, never asked again
    stale, _ = signed_in(organization, reauthenticated=True)
    age_reauthentication(stale, allauth_settings.REAUTHENTICATION_TIMEOUT + 1)
    for client in (never, stale):
        response = client.post(path, form(organization, fields(team)))
        assert response.status_code == 302, what
        assert response["Location"].startswith("/accounts/reauthenticate/?next="), what
        assert not done(team), what
    # a session re-authenticated just inside the timeout proceeds
    fresh, _ = signed_in(organization, reauthenticated=True)
    age_reauthentication(fresh, allauth_settings.REAUTHENTICATION_TIMEOUT - 30)
    assert fresh.post(path, form(organization, fields(team))).status_code == 302
    assert done(team), what


def test_the_suspended_action_is_done_once_the_password_is_confirmed(team: Team) -> None:
    owner, _ = signed_in(team.organization)
    asked = owner.post(MEMBERS, form(team.organization, {
        "action": "role", "member": team.member.pk, "role": "owner"}))
    assert Membership.objects.get(pk=team.member.pk).role == Role.MEMBER
    owner.post(asked["Location"], {"password": "correct horse battery"})
    assert Membership.objects.get(pk=team.member.pk).role == Role.OWNER


def test_actions_that_give_no_one_more_are_not_asked(team: Team) -> None:
    organization = team.organization
    Organization.objects.filter(pk=organization.pk).update(auto_approve=True)
    owner, _ = signed_in(organization)  # never re-authenticated
    for fields in ({"action": "auto_approve"},  # off: it spends nothing
                   {"action": "invite", "email": "member@example.com", "role": "member"},
                   {"action": "progress_webhooks", "progress_webhooks": "on"},
                   {"action": "name", "name": "Renamed"}):
        path = MEMBERS if fields["action"] == "invite" else SETTINGS
        response = owner.post(path, form(organization, fields))
        assert response.status_code == 302, fields
        assert "/accounts/reauthenticate/" not in response["Location"], fields
    organization.refresh_from_db()
    assert not organization.auto_approve and organization.name == "Renamed"
    invitation = Invitation.objects.get(organization=organization)
    assert owner.post(MEMBERS, form(organization, {
        "action": "revoke_invitation", "invitation": invitation.pk}))["Location"] == MEMBERS


def test_a_member_is_refused_without_being_asked_for_a_password(team: Team) -> None:
    member = Client()
    member.force_login(team.member.user)
    for fields in ({"action": "role", "member": team.member.pk, "role": "owner"},
                   {"action": "spend_limit", "member": team.member.pk, "spend_limit": ""},
                   {"action": "invite", "email": "x@example.com", "role": "owner"}):
        assert member.post(MEMBERS, form(team.organization, fields)).status_code == 403
    assert Membership.objects.get(pk=team.member.pk).role == Role.MEMBER


# The owners' mail ----------------------------------------------------------------------------

def owner_addresses(organization: Organization, *, but: str = "") -> list[str]:
    return sorted(email for email in Membership.objects.filter(
        organization=organization, role=Role.OWNER).values_list("user__email", flat=True)
        if email != but)


def test_the_owners_are_mailed_when_the_endpoint_changes(
        team: Team, django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    owner, owner_user = signed_in(team.organization, reauthenticated=True)
    with django_capture_on_commit_callbacks(execute=True):
        owner.post(SETTINGS, form(team.organization, {"action": "webhook",
                                                      "webhook_url": ELSEWHERE}))
    (message,) = mail.outbox
    assert sorted(message.to) == owner_addresses(team.organization)
    assert owner_user.email in message.to and team.member.user.email not in message.to
    assert "webhook endpoint" in message.subject
    assert owner_user.email in message.body
    # named as the audit log keeps them: host only, the path (often a credential) masked
    assert "93.184.215.14" in message.body and "93.184.215.15" in message.body
    assert "secret-path-token" not in message.body and "another-token" not in message.body
    # a change made elsewhere (staff in the admin) is mailed the same
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        organization_webhook_set(organization=team.organization, actor=SYSTEM, url="")
    (cleared,) = mail.outbox
    assert "no longer sent" in cleared.body


def test_the_owners_are_mailed_of_a_new_owner(
        team: Team, django_capture_on_commit_callbacks: Callable[..., Any]) -> None:
    organization = team.organization
    owner, owner_user = signed_in(organization, reauthenticated=True)
    # invited as an owner: every owner hears of it while it can still be revoked
    with django_capture_on_commit_callbacks(execute=True):
        owner.post(MEMBERS, form(organization, {"action": "invite", "email": "new@example.com",
                                                "role": "owner"}))
    (warned,) = [m for m in mail.outbox if m.to != ["new@example.com"]]
    assert sorted(warned.to) == owner_addresses(organization)
    assert "new@example.com" in warned.subject and owner_user.email in warned.body
    # made an owner: the owners but the new one hear of it
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        owner.post(MEMBERS, form(organization, {"action": "role", "member": team.member.pk,
                                                "role": "owner"}))
    (made,) = mail.outbox
    promoted = team.member.user.email
    assert sorted(made.to) == owner_addresses(organization, but=promoted)
    assert promoted in made.subject and f"{owner_user.email} changed their role" in made.body
    # an owner's invitation accepted: the owners before them hear of it
    mail.outbox.clear()
    invitation = Invitation.objects.get(organization=organization)
    joiner = user_make(email="new@example.com")
    EmailAddress.objects.create(user=joiner, email=joiner.email, verified=True, primary=True)
    from console.services import invitation_accept
    with django_capture_on_commit_callbacks(execute=True):
        invitation_accept(invitation=invitation, user=joiner)
    (joined,) = mail.outbox
    assert sorted(joined.to) == owner_addresses(organization, but="new@example.com")
    assert "by an invitation" in joined.body
    # a member made, or an owner made a member, mails no one
    mail.outbox.clear()
    with django_capture_on_commit_callbacks(execute=True):
        membership_role_set(membership=team.second_owner, actor=Actor(user=owner_user),
                            role=Role.MEMBER)
    assert mail.outbox == []
