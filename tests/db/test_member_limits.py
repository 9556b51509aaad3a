"""Issue 40 L7: a member's key had to carry a budget, but of any size, as many keys as the
organization's cap allows, and a member's approval in the console spent for no key at
all: a member could commit the whole balance. An owner now sets a member's spending limit
(the Members page); the budgets of the member's active keys, what their other keys spent
and what their console approvals held and charged stay within it. Owners are unaffected."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from django.utils import timezone
from pytest_django import Settings

from anex.errors import DomainError, PaymentRequired
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_grant, credits_summary, hold_settle
from console.actors import Actor
from console.constants import AuditAction, Role
from console.models import ApiKey, AuditEvent, Membership, Organization
from console.selectors import member_spend_committed
from console.services import api_key_create, membership_spend_limit_set
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve
from tests.db.test_console import form, signed_in
from tests.db.test_races import THREADS, race
from tests.factories import SYSTEM, job_make, organization_make, user_make

pytestmark = pytest.mark.django_db
KEYS = "/console/keys"
MEMBERS = "/console/members"


@pytest.fixture
def funded(settings: Settings) -> Organization:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    credits_grant(organization=organization, cents=100_000, reason="t", actor=SYSTEM)
    return organization


def limit(organization: Organization, user: Any, cents: int | None) -> None:
    membership = Membership.objects.get(organization=organization, user=user)
    membership_spend_limit_set(membership=membership, actor=SYSTEM, cents=cents)


def test_an_owner_sets_a_limit_on_the_members_page(funded: Organization) -> None:
    owner, owner_user = signed_in(funded, reauthenticated=True)
    member = user_make(funded, role=Role.MEMBER)
    membership = Membership.objects.get(user=member)
    page = owner.post(MEMBERS, form(funded, {"action": "spend_limit", "member": membership.pk,
                                             "spend_limit": "12.50"}), follow=True)
    assert "now has a spending limit of $12.50" in page.content.decode()
    membership.refresh_from_db()
    assert membership.spend_limit_cents == 1250
    event = AuditEvent.objects.get(organization=funded, action=AuditAction.MEMBER_SPEND_LIMIT_SET)
    assert event.data == {"user": member.username, "from": None, "to": 1250}
    assert event.actor_user == owner_user
    # the page shows it, with what the member already committed
    shown = owner.get(MEMBERS).content.decode()
    assert 'value="12.50"' in shown and "$0.00 committed" in shown
    # empty is no limit again
    owner.post(MEMBERS, form(funded, {"action": "spend_limit", "member": membership.pk,
                                      "spend_limit": ""}))
    membership.refresh_from_db()
    assert membership.spend_limit_cents is None


def test_a_members_key_budgets_stay_within_their_limit(funded: Organization) -> None:
    member, member_user = signed_in(funded, Role.MEMBER, reauthenticated=True)
    limit(funded, member_user, 1000)
    # given a key with a $6 budget
    assert member.post(KEYS, form(funded, {"name": "a", "spend_budget": "6"})).status_code == 200
    # when they ask for another with $5: past the $10 limit, refused on the form
    refused = member.post(KEYS, form(funded, {"name": "b", "spend_budget": "5"}))
    assert refused.status_code == 200
    assert "Your spending limit in" in refused.content.decode()
    assert "$4.00 is left" in refused.content.decode()
    assert not ApiKey.objects.filter(organization=funded, name="b").exists()
    # $4 still fits
    assert member.post(KEYS, form(funded, {"name": "c", "spend_budget": "4"})).status_code == 200
    assert set(ApiKey.objects.filter(organization=funded, created_by=member_user)
               .values_list("name", flat=True)) == {"a", "c"}
    # a revoked key counts what it spent, not its budget: revoking "a" (nothing spent)
    # frees its $6
    ApiKey.objects.filter(name="a", organization=funded).update(revoked_at=timezone.now())
    assert member_spend_committed(organization=funded, user=member_user) == 400
    with pytest.raises(PaymentRequired):
        api_key_create(organization=funded, actor=Actor(user=member_user),
                       spend_budget_cents=601)
    api_key_create(organization=funded, actor=Actor(user=member_user), spend_budget_cents=600)


def test_a_members_console_approval_stays_within_their_limit(funded: Organization) -> None:
    member, member_user = signed_in(funded, Role.MEMBER)
    limit(funded, member_user, 500)
    first = job_make(funded, est_cost_cents=300)
    second = job_make(funded, est_cost_cents=300)
    # the first fits: held for no key, as a person's approval is
    member.post(f"/console/jobs/{first.pk}/approve", form(funded))
    first.refresh_from_db()
    assert first.status == JobStatus.IN_PROGRESS and first.approved_by_user == member_user
    assert LedgerEntry.objects.get(job=first, kind=EntryKind.HOLD).api_key is None
    # the second would take them past $5: refused, nothing held
    page = member.post(f"/console/jobs/{second.pk}/approve", form(funded), follow=True)
    assert "Your spending limit in" in page.content.decode()
    second.refresh_from_db()
    assert second.status == JobStatus.COST_READY
    assert not LedgerEntry.objects.filter(job=second).exists()
    assert credits_summary(organization=funded).held == 300
    # the first settles at $1: its charge, not its hold, counts from then on
    hold_settle(job=first, cost_cents=100)
    assert member_spend_committed(organization=funded, user=member_user) == 100
    member.post(f"/console/jobs/{second.pk}/approve", form(funded))
    second.refresh_from_db()
    assert second.status == JobStatus.IN_PROGRESS
    # and a key's budget counts beside the approvals
    with pytest.raises(PaymentRequired):
        api_key_create(organization=funded, actor=Actor(user=member_user),
                       spend_budget_cents=101)


def test_a_members_unbudgeted_key_leaves_nothing_under_a_limit(funded: Organization) -> None:
    user = user_make(funded, role=Role.OWNER)
    api_key_create(organization=funded, actor=Actor(user=user))  # made as an owner
    Membership.objects.filter(user=user).update(role=Role.MEMBER)
    limit(funded, user, 10_000)
    assert member_spend_committed(organization=funded, user=user) is None
    with pytest.raises(PaymentRequired, match="has no spend budget"):
        job_approve(job=job_make(funded, est_cost_cents=1), actor=Actor(user=user))


def test_an_owner_is_not_held_to_a_limit(funded: Organization) -> None:
    owner, owner_user = signed_in(funded, reauthenticated=True)
    # a limit set while they were a member stays, and binds them only as a member
    Membership.objects.filter(user=owner_user).update(spend_limit_cents=100)
    assert owner.post(KEYS, form(funded, {"name": "unbudgeted"})).status_code == 200
    assert ApiKey.objects.get(name="unbudgeted").spend_budget_cents is None
    job = job_make(funded, est_cost_cents=5_000)
    owner.post(f"/console/jobs/{job.pk}/approve", form(funded))
    job.refresh_from_db()
    assert job.status == JobStatus.IN_PROGRESS
    # a member without a limit is bound as before: by their key budgets and the balance
    member, _ = signed_in(funded, Role.MEMBER)
    other = job_make(funded, est_cost_cents=5_000)
    member.post(f"/console/jobs/{other.pk}/approve", form(funded))
    other.refresh_from_db()
    assert other.status == JobStatus.IN_PROGRESS


@pytest.mark.django_db(transaction=True)
def test_concurrent_approvals_by_a_member_never_pass_their_limit(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    credits_grant(organization=organization, cents=100_000, reason="race", actor=SYSTEM)
    user = user_make(organization, role=Role.MEMBER)
    limit(organization, user, 300)
    jobs = iter([job_make(organization, est_cost_cents=60) for _ in range(THREADS)])
    taking = threading.Lock()

    def approve() -> Job:
        with taking:
            job = next(jobs)
        return job_approve(job=job, actor=Actor(user=user))

    results = race(approve)
    approved = [r for r in results if isinstance(r, Job)]
    refused = [r for r in results if isinstance(r, DomainError)]
    assert len(approved) == 5 and len(refused) == THREADS - 5, results
    assert {r.status for r in refused} == {402}
    assert credits_summary(organization=organization).held == 300
    assert member_spend_committed(organization=organization, user=user) == 300


def test_another_organizations_member_cannot_be_limited(funded: Organization) -> None:
    owner, _ = signed_in(funded, reauthenticated=True)
    theirs = organization_make()
    stranger = Membership.objects.get(user=user_make(theirs, role=Role.MEMBER))
    assert owner.post(MEMBERS, form(funded, {"action": "spend_limit", "member": stranger.pk,
                                             "spend_limit": "1"})).status_code == 404
    stranger.refresh_from_db()
    assert stranger.spend_limit_cents is None

