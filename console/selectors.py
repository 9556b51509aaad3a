"""Every scoped read of organizations, members and keys (STYLE.md rule 2)."""

from __future__ import annotations

import uuid

from django.contrib.auth.models import User
from django.utils import timezone

from anex.crypto import secret_decrypt
from anex.tenancy import scoped_get
from console.keys import key_parse, secret_matches
from console.models import ApiKey, Membership, Organization


def api_key_for_plaintext(raw: str) -> ApiKey | None:
    """The active key this plaintext is, or None (unknown, wrong secret, revoked, expired)."""
    parts = key_parse(raw)
    if parts is None:
        return None
    key = ApiKey.objects.select_related("organization").filter(prefix=parts.prefix).first()
    if key is None or not secret_matches(parts.secret, key.secret_hash):
        return None
    if key.revoked_at is not None:
        return None
    if key.expires_at is not None and key.expires_at <= timezone.now():
        return None
    return key


def api_key_get(*, organization: Organization, id: uuid.UUID | str) -> ApiKey:
    return scoped_get(ApiKey.objects.all(), organization=organization, id=id, noun="API key")



def organization_webhook_secret(*, organization: Organization) -> str | None:
    """The endpoint's signing secret, for its owners to see (the Settings page)."""
    encrypted = Organization.objects.values_list(
        "webhook_secret_encrypted", flat=True).get(pk=organization.pk)
    return secret_decrypt(encrypted) if encrypted else None


def membership_current(*, user: User) -> Membership | None:
    """The membership the console acts in: the user's first organization."""
    return (Membership.objects.filter(user=user).select_related("organization")
            .order_by("created_at").first())
