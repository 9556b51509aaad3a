"""The audit log is append-only in the database, and each service records its actor."""

from __future__ import annotations

import pytest
from django.db import IntegrityError, InternalError, transaction

from console.actors import Actor
from console.constants import Role
from console.models import AuditEvent, Organization
from console.services import membership_add, organization_update
from tests.factories import user_make

pytestmark = pytest.mark.django_db


def test_audit_events_cannot_be_changed(organization: Organization) -> None:
    event = AuditEvent.objects.for_org(organization).first()
    assert event is not None
    with pytest.raises((InternalError, IntegrityError), match="append-only"):
        with transaction.atomic():
            AuditEvent.objects.filter(pk=event.pk).update(actor_label="someone else")


def test_audit_events_cannot_be_deleted(organization: Organization) -> None:
    with pytest.raises((InternalError, IntegrityError), match="append-only"):
        with transaction.atomic():
            AuditEvent.objects.for_org(organization).delete()
    assert AuditEvent.objects.for_org(organization).exists()


def test_an_event_has_exactly_one_actor() -> None:
    with pytest.raises(ValueError):
        Actor()
    with pytest.raises(ValueError):
        Actor(system="a", user=user_make())


def test_settings_changes_record_what_changed_and_who_changed_it(
        organization: Organization) -> None:
    staff = user_make(is_staff=True)
    organization_update(organization=organization, actor=Actor(user=staff),
                        auto_approve=True, name=organization.name)
    event = AuditEvent.objects.for_org(organization).get(action="organization.updated")
    assert event.actor_user == staff
    assert event.actor_label == f"user {staff.get_username()}"
    assert event.data == {"auto_approve": {"from": False, "to": True}}
    organization.refresh_from_db()
    assert organization.auto_approve


def test_an_update_that_changes_nothing_records_nothing(organization: Organization) -> None:
    organization_update(organization=organization, actor=Actor(system="t"),
                        auto_approve=organization.auto_approve)
    assert not AuditEvent.objects.for_org(organization).filter(
        action="organization.updated").exists()


def test_unknown_settings_are_refused(organization: Organization) -> None:
    with pytest.raises(ValueError, match="not an organization setting"):
        organization_update(organization=organization, actor=Actor(system="t"), balance=10)


def test_adding_a_member_twice_adds_once(organization: Organization) -> None:
    user = user_make()
    actor = Actor(system="t")
    first = membership_add(organization=organization, user=user, role=Role.MEMBER, actor=actor)
    second = membership_add(organization=organization, user=user, role=Role.OWNER, actor=actor)
    assert first == second and second.role == Role.MEMBER
    assert AuditEvent.objects.for_org(organization).filter(action="member.added").count() == 1
