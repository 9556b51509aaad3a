"""What every API request does with its key: find the active key its plaintext is, and
record that it was used. Below console.services and console.selectors (which reach into
the jobs app), so the API's authentication stands on the tenants layer alone."""

from __future__ import annotations

from datetime import timedelta

from django.db.models import Q
from django.utils import timezone

from anex.internals.prepared import PreparedSelect
from console.keys import key_parse, secret_matches
from console.models import ApiKey

# last_used_at is advisory: writing it on every request would turn each read into a write.
LAST_USED_RESOLUTION = timedelta(minutes=1)


def api_key_for_plaintext(raw: str) -> ApiKey | None:
    """The active key this plaintext is, or None (unknown, wrong secret, revoked, expired)."""
    parts = key_parse(raw)
    if parts is None:
        return None
    key = _key_by_prefix(parts.prefix)
    if key is None:
        return None
    if not secret_matches(parts.secret, key.secret_hash):
        return None
    if not key.is_active:
        return None
    return key


def api_key_mark_used(*, key: ApiKey) -> None:
    """Record that the key was used, to LAST_USED_RESOLUTION. `key` was loaded for this
    request: when its last_used_at is already that fresh there is nothing to write, and a
    busy key's requests skip the UPDATE (a round trip and a row lock each) altogether."""
    now = timezone.now()
    stale = now - LAST_USED_RESOLUTION
    if key.last_used_at is not None and key.last_used_at >= stale:
        return
    # Conditional, so that concurrent first requests write it once between them.
    ApiKey.objects.filter(pk=key.pk).filter(
        Q(last_used_at__isnull=True) | Q(last_used_at__lt=stale)
    ).update(last_used_at=now)


# The key with its organization: compiled by the ORM once per process (anex.internals.prepared).
_KEY_BY_PREFIX = PreparedSelect(
    lambda prefix: ApiKey.objects.select_related("organization").filter(prefix=prefix)
    .order_by(), sentinels=("prefix",))


def _key_by_prefix(prefix: str) -> ApiKey | None:
    """ApiKey.objects.select_related("organization").filter(prefix=prefix).first(): the
    same SQL, the same conversions and the same instances, without compiling the query
    again on every API request (it was a tenth of a realtime request's CPU). A round trip
    still, so a revoked key is refused from its next request on."""
    return _KEY_BY_PREFIX.first(prefix)
