"""Tenancy in one place (docs/dev/style.md rule 2).

Every organization-owned model's manager is built from OrgScopedQuerySet, and every read
of one object by id goes through scoped_get: an id that is malformed, unknown, or owned by
another organization raises the same 404, so the API never tells them apart.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from django.db import models

from anex.errors import NotFound
from anex.internals.prepared import PreparedSelect

if TYPE_CHECKING:
    from console.models import Organization

M = TypeVar("M", bound=models.Model)


class OrgScopedQuerySet(models.QuerySet[M]):
    def for_org(self, organization: Organization) -> OrgScopedQuerySet[M]:
        return self.filter(organization=organization)


def _pk(id: Any, noun: str) -> uuid.UUID:
    try:
        return id if isinstance(id, uuid.UUID) else uuid.UUID(str(id))
    except ValueError:
        raise NotFound.of(noun) from None


def scoped_get(queryset: OrgScopedQuerySet[M], *, organization: Organization, id: Any,
               noun: str) -> M:
    obj = queryset.for_org(organization).filter(pk=_pk(id, noun)).first()
    if obj is None:
        raise NotFound.of(noun)
    return obj


class ScopedGet(Generic[M]):
    """scoped_get of `queryset()` for a read on a hot path (a poll customers send in a
    loop): the same object or the same 404, its query compiled once per process
    (anex.internals.prepared.PreparedSelect)."""

    def __init__(self, queryset: Callable[[], OrgScopedQuerySet[M]], *, noun: str) -> None:
        self.noun = noun
        self._select = PreparedSelect(
            lambda organization_id, pk: queryset().filter(
                organization_id=organization_id, pk=pk).order_by(),
            sentinels=(uuid.UUID(int=1), uuid.UUID(int=2)))

    def __call__(self, *, organization: Organization, id: Any) -> M:
        obj = self._select.first(organization.pk, _pk(id, self.noun))
        if obj is None:
            raise NotFound.of(self.noun)
        return obj
