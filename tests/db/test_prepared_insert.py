"""anex.internals.prepared.PreparedInsert: what objects.create() writes and returns,
compiled once."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.signals import post_save, pre_save
from django.test.utils import CaptureQueriesContext

from anex.internals.prepared import PreparedInsert
from console.models import ApiKey
from realtime.constants import Endpoint
from realtime.models import RealtimeUsage

pytestmark = pytest.mark.django_db


def _values(key: ApiKey, **extra: Any) -> dict[str, Any]:
    return {"organization_id": key.organization_id, "api_key": key,
            "endpoint": Endpoint.EMBEDDINGS, "model": "all-minilm-l6-v2", "input_tokens": 12,
            "cost_usd": Decimal("0.000000240000"), "request_id": "req_1", **extra}


def test_it_writes_and_returns_what_create_does(api_key: ApiKey) -> None:
    insert = PreparedInsert(RealtimeUsage)
    # when the same values are created both ways, twice through the compiled statement
    orm = RealtimeUsage.objects.create(**_values(api_key))
    with CaptureQueriesContext(connection) as queries:
        first = insert.create(**_values(api_key))
        second = insert.create(**_values(api_key, input_tokens=13, request_id=""))
    # then each is one INSERT, and the rows and instances are alike but for id and time
    assert len(queries) == 2
    assert first.pk > orm.pk and second.pk > first.pk
    assert not first._state.adding and first._state.db == "default"
    for made in (first, second):
        stored = RealtimeUsage.objects.get(pk=made.pk)
        for field in RealtimeUsage._meta.concrete_fields:
            assert getattr(made, field.attname) == getattr(stored, field.attname), field.name
        assert made.created_at is not None and made.created_at >= orm.created_at
        assert made.settled is False
    for field in RealtimeUsage._meta.concrete_fields:
        if field.name not in ("id", "created_at"):
            assert getattr(first, field.attname) == getattr(orm, field.attname), field.name
    assert (second.input_tokens, second.request_id) == (13, "")


def test_it_sends_the_save_signals(api_key: ApiKey) -> None:
    seen: list[tuple[str, Any]] = []

    def before(sender: Any, instance: RealtimeUsage, **kwargs: Any) -> None:
        seen.append(("pre", instance.pk))

    def after(sender: Any, instance: RealtimeUsage, created: bool, **kwargs: Any) -> None:
        seen.append(("post", (instance.pk, created)))

    pre_save.connect(before, sender=RealtimeUsage)
    post_save.connect(after, sender=RealtimeUsage)
    try:
        made = PreparedInsert(RealtimeUsage).create(**_values(api_key))
    finally:
        pre_save.disconnect(before, sender=RealtimeUsage)
        post_save.disconnect(after, sender=RealtimeUsage)
    assert seen == [("pre", None), ("post", (made.pk, True))]


def test_a_failed_insert_marks_the_transaction_for_rollback(api_key: ApiKey) -> None:
    insert = PreparedInsert(RealtimeUsage)
    insert.create(**_values(api_key))
    with transaction.atomic():
        with pytest.raises(IntegrityError):
            insert.create(**_values(api_key, endpoint=None))
        # as the ORM's create() leaves it: the block rolls back, nothing half-written stays
        assert connection.needs_rollback
    assert RealtimeUsage.objects.count() == 1
