"""Every scoped read of organizations, members and keys (docs/dev/style.md rule 2)."""

from __future__ import annotations

import uuid
from datetime import date, timedelta

from django.conf import settings
from django.contrib.auth.models import User
from django.db.models import F, QuerySet, Sum
from django.db.models.functions import TruncDate
from django.utils import timezone

from anex.crypto import secret_decrypt
from anex.errors import Malformed, NotFound
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import key_spend_cents
from console.models import ApiKey, AuditEvent, Invitation, Membership, Organization
from console.tenancy import scoped_get
from inference.catalog import CatalogModel, catalog, local_models, model_get


def api_key_get(*, organization: Organization, id: uuid.UUID | str) -> ApiKey:
    return scoped_get(ApiKey.objects.all(), organization=organization, id=id, noun="API key")


def api_key_list(*, organization: Organization) -> QuerySet[ApiKey]:
    return ApiKey.objects.for_org(organization).select_related("created_by")


def organization_has_webhook_secret(*, organization: Organization) -> bool:
    """Whether the endpoint has a signing secret (the Settings page offers to reveal it)."""
    return Organization.objects.filter(pk=organization.pk).exclude(
        webhook_secret_encrypted="").exists()


def organization_webhook_secret(*, organization: Organization) -> str | None:
    """The endpoint's signing secret, for its owners to see (the Settings page's Reveal)."""
    encrypted = Organization.objects.values_list(
        "webhook_secret_encrypted", flat=True).get(pk=organization.pk)
    return secret_decrypt(encrypted) if encrypted else None


def membership_current(*, user: User, organization_id: str | None = None) -> Membership | None:
    """The membership the console acts in: the organization the user picked (kept in
    their session), else their first one. An id that is not one of theirs is ignored."""
    memberships = Membership.objects.filter(user=user).select_related("organization")
    chosen = None
    if organization_id:
        try:
            chosen = memberships.filter(organization_id=uuid.UUID(organization_id)).first()
        except ValueError:
            chosen = None
    return chosen or memberships.order_by("created_at").first()


def membership_list(*, user: User) -> QuerySet[Membership]:
    """Every organization the user belongs to (the organization switcher)."""
    return (Membership.objects.filter(user=user).select_related("organization")
            .order_by("organization__name"))


def organization_member_list(*, organization: Organization) -> QuerySet[Membership]:
    return Membership.objects.for_org(organization).select_related("user").order_by("created_at")


def membership_get(*, organization: Organization, id: int | str) -> Membership:
    """One member of the organization; another organization's (or a malformed id) is 404."""
    membership = None
    if str(id).isdigit():
        membership = (Membership.objects.for_org(organization).select_related(
            "user", "organization").filter(pk=int(id)).first())
    if membership is None:
        raise NotFound.of("Member")
    return membership


def member_spend_committed(*, organization: Organization, user: User) -> int | None:
    """What a member's spending in the organization already takes of their limit
    (Membership.spend_limit_cents): the whole budget of each active key they created (it
    may all be spent, by jobs or realtime, without them asking anyone), what each of their
    revoked or expired keys did spend, and what their console approvals held and charged.
    None when one of their active keys has no budget (made while they were an owner): no
    limit covers it."""
    committed = 0
    for key in ApiKey.objects.for_org(organization).filter(created_by=user):
        if key.is_active:
            if key.spend_budget_cents is None:
                return None
            committed += key.spend_budget_cents
        else:
            committed += key_spend_cents(api_key=key)
    # A person's console approval spends for no key (billing.services.hold_place): its
    # entries carry the job, and the job who approved it. Holds in, releases out, charges
    # in, as key_spend_cents counts a key's.
    approved = (LedgerEntry.objects.for_org(organization)
                .filter(kind__in=[EntryKind.HOLD, EntryKind.RELEASE, EntryKind.CHARGE],
                        api_key__isnull=True, job__approved_by_user=user)
                .aggregate(spent=Sum(F("held_delta") - F("balance_delta")))["spent"])
    return committed + int(approved or 0)


def invitation_get(*, organization: Organization, id: uuid.UUID | str) -> Invitation:
    return scoped_get(Invitation.objects.select_related("organization"),
                      organization=organization, id=id, noun="Invitation")


def invitation_open_list(*, organization: Organization) -> QuerySet[Invitation]:
    return Invitation.objects.for_org(organization).filter(
        accepted_at__isnull=True, expires_at__gt=timezone.now())


def audit_event_list(*, organization: Organization) -> QuerySet[AuditEvent]:
    return AuditEvent.objects.for_org(organization)


# A charge with no job is realtime usage, settled per key over every model it used.
REALTIME_SPEND = "realtime (all models)"


def spend_per_day(*, organization: Organization,
                  days: int = 30) -> tuple[list[date], dict[tuple[date, str], int]]:
    """The last `days` UTC days (today included), oldest first, and the credits charged
    on each by model: a sum over the ledger's charge entries, each a job's (its model) or
    realtime usage's (REALTIME_SPEND). A day or model without charges has no entry."""
    today = timezone.localdate()
    first = today - timedelta(days=days - 1)
    rows = (LedgerEntry.objects.for_org(organization)
            .filter(kind=EntryKind.CHARGE, created_at__date__gte=first)
            .annotate(day=TruncDate("created_at")).values("day", "job__model")
            .annotate(spent=Sum("balance_delta")))
    spent: dict[tuple[date, str], int] = {}
    for row in rows:
        key = (row["day"], row["job__model"] or REALTIME_SPEND)
        spent[key] = spent.get(key, 0) - row["spent"]
    return [first + timedelta(days=n) for n in range(days)], spent


def model_for_key(model_id: str, key: ApiKey | None) -> CatalogModel:
    """The catalog model, if this key may use it (ApiKey.allows; the console acts without
    a key): a model outside a key's scopes is neither listed nor accepted, so it reads
    exactly like an unknown id. The batch submit, a preflight check and the realtime API
    all admit a model here."""
    model = model_get(model_id)
    if model is None or (key is not None and not key.allows(model_id)):
        raise Malformed(f"Unknown model '{model_id}': pass a model id from the models "
                        "table, verbatim.")
    return model


def console_models() -> list[CatalogModel]:
    """The model dropdown: the public catalog, plus the local models this deployment
    serves from its own checkpoints (the embedded default's)."""
    local = [m for model_id, m in local_models().items() if model_id in settings.ANEX_CHECKPOINTS]
    return [*local, *catalog().values()]
