"""What every API request does with its key: find the active key its plaintext is, and
record that it was used. Below console.services and console.selectors (which reach into
the jobs app), so the API's authentication stands on the tenants layer alone."""

from __future__ import annotations

import threading
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Q
from django.db.models.query import get_related_populators  # type: ignore[attr-defined]
from django.utils import timezone

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


@dataclass(frozen=True)
class _KeyQuery:
    """The key-with-its-organization query, compiled by the ORM once per process: its SQL
    (the prefix its one parameter), the converters the ORM applies to its columns, and how
    a row becomes the key and its organization (ModelIterable's own steps)."""

    sql: str
    converters: tuple[tuple[int, tuple[Any, ...], Any], ...]
    key_fields: slice
    key_names: tuple[str, ...]
    populators: tuple[Any, ...]


_key_query: _KeyQuery | None = None
_key_query_lock = threading.Lock()
_PLACEHOLDER = "prefix"


def _key_query_get() -> _KeyQuery:
    global _key_query
    if _key_query is not None:
        return _key_query
    with _key_query_lock:
        if _key_query is None:
            queryset = ApiKey.objects.select_related("organization").filter(
                prefix=_PLACEHOLDER).order_by()
            compiler = queryset.query.get_compiler(using=DEFAULT_DB_ALIAS)
            sql, params = compiler.as_sql()
            assert list(params) == [_PLACEHOLDER], params
            select, klass_info = compiler.select, compiler.klass_info
            assert klass_info is not None
            fields = klass_info["select_fields"]
            converters = compiler.get_converters([column[0] for column in select])
            _key_query = _KeyQuery(
                sql=sql,
                converters=tuple((pos, tuple(convs), expression)
                                 for pos, (convs, expression) in converters.items()),
                key_fields=slice(fields[0], fields[-1] + 1),
                key_names=tuple(column[0].target.attname
                                for column in select[fields[0]:fields[-1] + 1]),
                populators=tuple(get_related_populators(klass_info, select,
                                                        DEFAULT_DB_ALIAS)))
        return _key_query


def _key_by_prefix(prefix: str) -> ApiKey | None:
    """ApiKey.objects.select_related("organization").get(prefix=prefix), or None: the same
    SQL, the same conversions and the same instances, without compiling the query again on
    every API request (it was a tenth of a realtime request's CPU). A round trip still, so
    a revoked key is refused from its next request on."""
    query = _key_query_get()
    connection = connections[DEFAULT_DB_ALIAS]
    with connection.cursor() as cursor:
        cursor.execute(query.sql, [prefix])
        fetched = cursor.fetchone()
    if fetched is None:
        return None
    row = list(fetched)
    for pos, convs, expression in query.converters:
        value = row[pos]
        for converter in convs:
            value = converter(value, expression, connection)
        row[pos] = value
    key = ApiKey.from_db(DEFAULT_DB_ALIAS, list(query.key_names), row[query.key_fields])
    for populator in query.populators:
        populator.populate(row, key)
    return key
