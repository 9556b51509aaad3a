"""API keys: the format, the hash at rest, revocation, expiry and last use."""

from __future__ import annotations

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from console.apikeys import _key_by_prefix, api_key_for_plaintext, api_key_mark_used
from console.keys import key_generate, key_parse, secret_hash
from console.models import ApiKey, AuditEvent
from console.services import api_key_revoke
from tests.factories import SYSTEM, api_key_make

pytestmark = pytest.mark.django_db


def test_a_key_is_sk_then_its_prefix_then_its_secret() -> None:
    parts = key_generate()
    assert parts.plaintext == f"sk-{parts.prefix}_{parts.secret}"
    assert key_parse(parts.plaintext) == parts


@pytest.mark.parametrize("raw", ["", "sk-", "pk-abcdefghijkl_" + "a" * 40,
                                 "sk-abcdefghijkl-" + "a" * 40, "sk-ABCDEFGHIJKL_" + "a" * 40,
                                 "sk-abcdefghijkl_" + "a" * 39 + "!"])
def test_malformed_keys_do_not_parse(raw: str) -> None:
    assert key_parse(raw) is None


def test_only_a_hash_of_the_secret_is_stored() -> None:
    key, plaintext = api_key_make()
    secret = key_parse(plaintext).secret  # type: ignore[union-attr]
    assert key.secret_hash == secret_hash(secret)
    # Not in any column of any table: dump the whole database as text and look.
    with connection.cursor() as cursor:
        cursor.execute("""
            SELECT table_name FROM information_schema.tables
            WHERE table_schema = 'public' AND table_type = 'BASE TABLE'
        """)
        tables = [row[0] for row in cursor.fetchall()]
        for table in tables:
            cursor.execute(f'SELECT CAST(t.* AS text) FROM "{table}" t')  # noqa: S608
            for (row,) in cursor.fetchall():
                assert secret not in row, f"the key's secret is stored in {table}"


def test_the_plaintext_finds_its_key_and_nothing_else_does() -> None:
    key, plaintext = api_key_make()
    assert api_key_for_plaintext(plaintext) == key
    wrong_secret = plaintext[:-1] + ("A" if plaintext[-1] != "A" else "B")
    assert api_key_for_plaintext(wrong_secret) is None
    assert api_key_for_plaintext(key_generate().plaintext) is None


def test_the_key_lookup_gives_what_the_orm_gives_in_one_query() -> None:
    # given a key with every kind of column set
    key, plaintext = api_key_make(model_scopes=["all-minilm-l6-v2", "laya"],
                                  spend_budget_cents=500, rate_limit_per_minute=7,
                                  expires_at=timezone.now() + timedelta(days=1))
    api_key_mark_used(key=key)
    orm = ApiKey.objects.select_related("organization").get(pk=key.pk)
    # when it is looked up by its plaintext
    with CaptureQueriesContext(connection) as queries:
        found = api_key_for_plaintext(plaintext)
        assert found is not None
        organization = found.organization
    # then one query read the key and its organization, as the ORM would have built them
    assert len(queries) == 1
    for field in ApiKey._meta.concrete_fields:
        assert getattr(found, field.attname) == getattr(orm, field.attname), field.name
    for field in type(organization)._meta.concrete_fields:
        assert getattr(organization, field.attname) == getattr(orm.organization,
                                                               field.attname), field.name
    assert found.expires_at is not None and found.expires_at.tzinfo is not None
    assert not found._state.adding and found._state.db == "default"
    assert _key_by_prefix("nothing") is None


def test_a_revoked_key_is_refused_and_a_second_revoke_changes_nothing() -> None:
    key, plaintext = api_key_make()
    api_key_revoke(key=key, actor=SYSTEM)
    first = key.revoked_at
    api_key_revoke(key=key, actor=SYSTEM)
    assert key.revoked_at == first
    assert api_key_for_plaintext(plaintext) is None
    assert AuditEvent.objects.filter(action="api_key.revoked", target_id=str(key.pk)).count() == 1


def test_an_expired_key_is_refused() -> None:
    _key, plaintext = api_key_make(expires_at=timezone.now() - timedelta(seconds=1))
    assert api_key_for_plaintext(plaintext) is None
    _key, live = api_key_make(expires_at=timezone.now() + timedelta(days=1))
    assert api_key_for_plaintext(live) is not None


def test_last_used_is_recorded_at_most_once_a_minute() -> None:
    key, _plaintext = api_key_make()
    api_key_mark_used(key=key)
    first = ApiKey.objects.get(pk=key.pk).last_used_at
    assert first is not None
    api_key_mark_used(key=key)
    assert ApiKey.objects.get(pk=key.pk).last_used_at == first
    ApiKey.objects.filter(pk=key.pk).update(last_used_at=first - timedelta(minutes=2))
    api_key_mark_used(key=key)
    refreshed = ApiKey.objects.get(pk=key.pk).last_used_at
    assert refreshed is not None and refreshed > first - timedelta(minutes=2)


def test_key_limits_are_recorded() -> None:
    key, _ = api_key_make(model_scopes=["laya", "qwen3-embedding-8b", "laya"],
                          spend_budget_cents=500, rate_limit_per_minute=30)
    key.refresh_from_db()
    assert key.model_scopes == ["laya", "qwen3-embedding-8b"]
    assert (key.spend_budget_cents, key.rate_limit_per_minute) == (500, 30)
