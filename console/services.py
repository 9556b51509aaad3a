"""Every write to organizations, members, keys and the audit log (STYLE.md rule 1)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib.auth.models import User
from django.db import transaction
from django.db.models import Q
from django.utils import timezone

from billing.services import credits_grant
from console.actors import Actor
from console.audit import audit_record
from console.constants import AuditAction, Role
from console.keys import key_generate, secret_hash
from console.models import ApiKey, Membership, Organization

# last_used_at is advisory: writing it on every request would turn each read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@transaction.atomic
def organization_create(*, name: str, actor: Actor, eu_data_routing: bool = False,
                        auto_approve: bool = False) -> Organization:
    organization = Organization.objects.create(
        name=name, eu_data_routing=eu_data_routing, auto_approve=auto_approve
    )
    audit_record(
        organization=organization, actor=actor, action=AuditAction.ORGANIZATION_CREATED,
        target=organization,
        data={"name": name, "eu_data_routing": eu_data_routing, "auto_approve": auto_approve},
    )
    if settings.ANEX_FREE_GRANT_CENTS > 0:
        credits_grant(organization=organization, cents=settings.ANEX_FREE_GRANT_CENTS,
                      reason="free grant for a new organization", actor=actor,
                      idempotency_key=f"grant:new-organization:{organization.pk}")
    return organization


# The organization settings a service may change, and how each is recorded.
ORGANIZATION_SETTINGS = ("name", "webhook_url", "auto_approve", "eu_data_routing")


@transaction.atomic
def organization_update(*, organization: Organization, actor: Actor,
                        **changes: Any) -> Organization:
    unknown = set(changes) - set(ORGANIZATION_SETTINGS)
    if unknown:
        raise ValueError(f"not an organization setting: {', '.join(sorted(unknown))}")
    locked = Organization.objects.select_for_update().get(pk=organization.pk)
    changed = {
        name: {"from": getattr(locked, name), "to": value}
        for name, value in changes.items()
        if getattr(locked, name) != value
    }
    if changed:
        Organization.objects.filter(pk=locked.pk).update(**{n: c["to"] for n, c in changed.items()})
        audit_record(
            organization=locked, actor=actor, action=AuditAction.ORGANIZATION_UPDATED,
            target=locked, data=changed,
        )
    organization.refresh_from_db()
    return organization


@transaction.atomic
def membership_add(*, organization: Organization, user: User, role: Role,
                   actor: Actor) -> Membership:
    membership, created = Membership.objects.get_or_create(
        organization=organization, user=user, defaults={"role": role}
    )
    if created:
        audit_record(
            organization=organization, actor=actor, action=AuditAction.MEMBER_ADDED,
            target=membership, data={"user": user.get_username(), "role": str(role)},
        )
    return membership


@transaction.atomic
def api_key_create(*, organization: Organization, actor: Actor, name: str = "",
                   expires_at: datetime | None = None, model_scopes: Iterable[str] = (),
                   spend_budget_cents: int | None = None,
                   rate_limit_per_minute: int | None = None) -> tuple[ApiKey, str]:
    """Create a key; returns it with its plaintext, which is never available again."""
    parts = key_generate()
    key = ApiKey.objects.create(
        organization=organization,
        name=name,
        prefix=parts.prefix,
        secret_hash=secret_hash(parts.secret),
        created_by=actor.user,
        expires_at=expires_at,
        model_scopes=sorted(set(model_scopes)),
        spend_budget_cents=spend_budget_cents,
        rate_limit_per_minute=rate_limit_per_minute,
    )
    audit_record(
        organization=organization, actor=actor, action=AuditAction.API_KEY_CREATED,
        target=key,
        data={
            "prefix": key.prefix,
            "name": name,
            "expires_at": expires_at.isoformat() if expires_at else None,
            "model_scopes": key.model_scopes,
            "spend_budget_cents": spend_budget_cents,
            "rate_limit_per_minute": rate_limit_per_minute,
        },
    )
    return key, parts.plaintext


@transaction.atomic
def api_key_revoke(*, key: ApiKey, actor: Actor) -> ApiKey:
    """Revoke a key. A repeat is a no-op: the first revocation time and audit entry stand."""
    revoked = ApiKey.objects.filter(pk=key.pk, revoked_at__isnull=True).update(
        revoked_at=timezone.now()
    )
    key.refresh_from_db(fields=["revoked_at"])
    if revoked == 1:
        audit_record(
            organization=key.organization, actor=actor, action=AuditAction.API_KEY_REVOKED,
            target=key, data={"prefix": key.prefix},
        )
    return key


def api_key_mark_used(*, key: ApiKey) -> None:
    now = timezone.now()
    ApiKey.objects.filter(pk=key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=now - LAST_USED_RESOLUTION)
    ).update(last_used_at=now)
