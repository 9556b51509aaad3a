"""Roles and offboarding (issue 22, M5): each test performs what a member (or a removed
member) could do before, and sees it refused or undone.

- an owner removes a member (audited; optionally revoking the keys they created), changes
  a role, revokes an invitation; never the last owner; a member can do none of it;
- a member revokes only the keys they created, and creates only keys with a budget;
- an organization holds at most ANEX_API_KEYS_MAX active keys, and its keys share one
  organization-wide rate beside each key's own;
- console actions (POSTs) are rate-limited per person.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.test import Client
from pytest_django import Settings

from console.constants import AuditAction, Role
from console.models import ApiKey, AuditEvent, Invitation, Membership, Organization
from console.services import invitation_for_token
from tests.db.test_console import form, signed_in
from tests.factories import api_key_make, organization_make

pytestmark = pytest.mark.django_db
MEMBERS = "/console/members"
KEYS = "/console/keys"
JOB = "/batch/v1/jobs/0b6e4e9c-58d4-4b4e-9f4e-1c2b3a4d5e6f"  # none: 404 once admitted


def membership(organization: Organization, client_user: Any) -> Membership:
    return Membership.objects.get(organization=organization, user=client_user)


def test_an_owner_removes_a_member_and_their_keys_stop_working(
        organization: Organization) -> None:
    owner, _ = signed_in(organization, reauthenticated=True)
    member, member_user = signed_in(organization, Role.MEMBER, reauthenticated=True)
    # given a member who made a key (with a budget, as members must)
    assert member.post(KEYS, form(organization, {"name": "theirs", "spend_budget": "5"})
                       ).status_code == 200
    theirs = ApiKey.objects.get(organization=organization, created_by=member_user)
    other = api_key_make(organization)[0]
    # when an owner removes them, revoking their keys
    gone = membership(organization, member_user)
    response = owner.post(MEMBERS, form(organization, {"action": "remove", "member": gone.pk,
                                    "revoke_keys": "on"}))
    assert response.status_code == 302
    # then they are out: the console no longer acts for them in it
    assert not Membership.objects.filter(pk=gone.pk).exists()
    assert member.get(KEYS).status_code == 200  # their own page: no organization left
    assert organization.name not in member.get(KEYS).content.decode()
    # and the key they made answers 401; a key they did not make is untouched
    theirs.refresh_from_db()
    other.refresh_from_db()
    assert theirs.revoked_at is not None and other.revoked_at is None
    event = AuditEvent.objects.get(organization=organization, action=AuditAction.MEMBER_REMOVED)
    assert event.data == {"user": member_user.username, "role": "member",
                          "keys_revoked": [theirs.prefix]}


def test_the_last_owner_cannot_be_removed_or_demoted(organization: Organization) -> None:
    owner, owner_user = signed_in(organization, reauthenticated=True)
    mine = membership(organization, owner_user)
    owner.post(MEMBERS, form(organization, {"action": "remove", "member": mine.pk}))
    owner.post(MEMBERS, form(organization, {"action": "role", "member": mine.pk, "role": "member"}))
    mine.refresh_from_db()
    assert mine.role == Role.OWNER
    page = owner.get(MEMBERS).content.decode()
    assert "is the last owner of" in page
    # with a second owner, the first may step down
    _, second_user = signed_in(organization, Role.MEMBER)
    owner.post(MEMBERS, form(organization, {
        "action": "role", "member": membership(organization, second_user).pk, "role": "owner"}))
    owner.post(MEMBERS, form(organization, {"action": "role", "member": mine.pk, "role": "member"}))
    mine.refresh_from_db()
    assert mine.role == Role.MEMBER
    assert AuditEvent.objects.filter(organization=organization,
                                     action=AuditAction.MEMBER_ROLE_CHANGED).count() == 2


def test_a_member_cannot_remove_promote_or_revoke_invitations(
        organization: Organization) -> None:
    owner, owner_user = signed_in(organization)
    member, member_user = signed_in(organization, Role.MEMBER)
    owner.post(MEMBERS, form(organization, {"action": "invite", "email": "new@example.com",
                                            "role": "member"}))
    invitation = Invitation.objects.get(organization=organization)
    attempts = [
        {"action": "remove", "member": membership(organization, owner_user).pk},
        {"action": "role", "member": membership(organization, member_user).pk,
         "role": "owner"},
        {"action": "revoke_invitation", "invitation": invitation.pk},
    ]
    for attempt in attempts:
        assert member.post(MEMBERS, form(organization, attempt)).status_code == 403, attempt
    assert membership(organization, member_user).role == Role.MEMBER
    assert Membership.objects.filter(organization=organization).count() == 2
    invitation.refresh_from_db()
    assert invitation.expires_at > invitation.created_at


def test_a_revoked_invitation_link_stops_working(
        organization: Organization, django_capture_on_commit_callbacks: Any) -> None:
    from django.core import mail

    owner, _ = signed_in(organization, reauthenticated=True)
    with django_capture_on_commit_callbacks(execute=True):
        owner.post(MEMBERS, form(organization, {"action": "invite", "email": "new@example.com",
                                                "role": "owner"}))
    invitation = Invitation.objects.get(organization=organization)
    # (the owners are mailed of an owner's invitation too: issue 40 L1)
    (invited,) = [message for message in mail.outbox if message.to == ["new@example.com"]]
    token = invited.body.split("/console/invitations/")[1].split()[0]
    assert invitation_for_token(token) is not None
    owner.post(MEMBERS, form(organization, {"action": "revoke_invitation",
                                            "invitation": invitation.pk}))
    assert invitation_for_token(token) is None
    # the invitee, signed up with that address, cannot join with it
    invitee = Client()
    from allauth.account.models import EmailAddress

    from tests.factories import user_make
    user = user_make(email="new@example.com")
    EmailAddress.objects.create(user=user, email=user.email, verified=True, primary=True)
    invitee.force_login(user)
    invitee.post(f"/console/invitations/{token}")
    assert not Membership.objects.filter(organization=organization, user=user).exists()
    assert AuditEvent.objects.filter(organization=organization,
                                     action=AuditAction.INVITATION_REVOKED).count() == 1


def test_another_organizations_member_or_invitation_is_404(organization: Organization) -> None:
    owner, _ = signed_in(organization, reauthenticated=True)
    theirs = organization_make()
    _, their_user = signed_in(theirs)
    their_member = membership(theirs, their_user)
    assert owner.post(MEMBERS, form(organization, {"action": "remove",
                                                   "member": their_member.pk})).status_code == 404
    assert owner.post(MEMBERS, form(organization, {"action": "role", "member": "x",
                                                   "role": "owner"})).status_code == 404
    assert Membership.objects.filter(pk=their_member.pk).exists()


def test_a_member_revokes_only_the_keys_they_created(organization: Organization) -> None:
    owner, owner_user = signed_in(organization, reauthenticated=True)
    member, member_user = signed_in(organization, Role.MEMBER, reauthenticated=True)
    # given the owner's key and the member's own
    owner.post(KEYS, form(organization, {"name": "owner's"}))
    owners_key = ApiKey.objects.get(created_by=owner_user)
    member.post(KEYS, form(organization, {"name": "mine", "spend_budget": "5"}))
    members_key = ApiKey.objects.get(created_by=member_user)
    # the member is refused the owner's key, and not offered the button
    assert member.post(f"{KEYS}/{owners_key.pk}/revoke", form(organization)).status_code == 403
    owners_key.refresh_from_db()
    assert owners_key.revoked_at is None
    assert f"{KEYS}/{owners_key.pk}/revoke" not in member.get(KEYS).content.decode()
    # their own key they may revoke; the owner may revoke anyone's
    assert member.post(f"{KEYS}/{members_key.pk}/revoke", form(organization)).status_code == 302
    members_key.refresh_from_db()
    assert members_key.revoked_at is not None
    assert owner.post(f"{KEYS}/{owners_key.pk}/revoke", form(organization)).status_code == 302


def test_a_member_cannot_create_an_unbudgeted_key(organization: Organization) -> None:
    member, member_user = signed_in(organization, Role.MEMBER, reauthenticated=True)
    page = member.post(KEYS, form(organization, {"name": "unbounded"})).content.decode()
    assert "A member&#x27;s key needs a spend budget" in page
    assert not ApiKey.objects.filter(created_by=member_user).exists()


def test_keys_per_organization_are_capped(organization: Organization,
                                          settings: Settings) -> None:
    settings.ANEX_API_KEYS_MAX = 3
    owner, _owner_user = signed_in(organization, reauthenticated=True)
    for n in range(3):
        owner.post(KEYS, form(organization, {"name": f"k{n}"}))
    page = owner.post(KEYS, form(organization, {"name": "one too many"})).content.decode()
    assert "has 3 active API keys, the most an organization may have" in page
    assert ApiKey.objects.filter(organization=organization).count() == 3
    # a revoked key frees its place
    owner.post(f"{KEYS}/{ApiKey.objects.filter(organization=organization)[0].pk}/revoke",
               form(organization))
    owner.post(KEYS, form(organization, {"name": "replacement"}))
    assert ApiKey.objects.filter(organization=organization, name="replacement").exists()


def test_an_organizations_keys_share_one_rate(organization: Organization, settings: Settings,
                                              client_for: Any) -> None:
    # More keys used to mean more rate: each key had its own 600 a minute.
    settings.ANEX_ORG_RATE_LIMIT_PER_MINUTE = 4
    clients = [client_for(api_key_make(organization)[1]) for _ in range(3)]
    codes = [clients[n % 3].get(JOB).status_code for n in range(6)]
    assert codes == [404, 404, 404, 404, 429, 429]
    refused = clients[0].get(JOB)
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert "this organization's API keys together" in refused.json()["detail"]
    assert int(refused["Retry-After"]) >= 1
    # another organization is not held by it
    assert client_for(api_key_make(organization_make())[1]).get(JOB).status_code == 404


def test_console_actions_are_rate_limited_per_person(organization: Organization,
                                                     settings: Settings) -> None:
    from anex.redis import redis_client

    settings.ANEX_CONSOLE_ACTIONS_PER_MINUTE = 2
    owner, owner_user = signed_in(organization, reauthenticated=True)
    # A user id repeats in each run's fresh database; its window may outlive an earlier run.
    for counter in redis_client().scan_iter(f"anex:console-actions:{owner_user.pk}:*"):
        redis_client().delete(counter)
    for n in range(4):
        owner.post(KEYS, form(organization, {"name": f"k{n}"}))
    assert ApiKey.objects.filter(organization=organization).count() == 2
    assert "Too many actions" in owner.get(KEYS).content.decode()


def test_the_invite_form_starts_on_member_with_no_errors(organization: Organization) -> None:
    """An owner who only types an address invites a member: the form on GET is unbound, so
    its role select starts on member (it once started bound and empty: owner, the first
    choice, with "required" errors)."""
    owner, _ = signed_in(organization)
    page = owner.get("/console/members").content.decode()
    assert 'value="member" selected' in page
    assert "This field is required" not in page
    owner.post("/console/members", form(organization, {"action": "invite",
                                                       "email": "new@example.com",
                                                       "role": "member"}))
    assert Invitation.objects.get(email="new@example.com").role == Role.MEMBER
