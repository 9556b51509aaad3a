"""Tenancy in one place (STYLE.md rule 2).

Every organization-owned model's manager is built from OrgScopedQuerySet, and every read
of one object by id goes through scoped_get: an id that is malformed, unknown, or owned by
another organization raises the same 404, so the API never tells them apart.
"""

from __future__ import annotations

import uuid
from typing import TYPE_CHECKING, Any, TypeVar

from django.db import models

from anex.errors import NotFound

if TYPE_CHECKING:
    from console.models import Organization

M = TypeVar("M", bound=models.Model)


class OrgScopedQuerySet(models.QuerySet[M]):
    def for_org(self, organization: Organization) -> OrgScopedQuerySet[M]:
        return self.filter(organization=organization)


def scoped_get(queryset: OrgScopedQuerySet[M], *, organization: Organization, id: Any,
               noun: str) -> M:
    try:
        pk = id if isinstance(id, uuid.UUID) else uuid.UUID(str(id))
    except ValueError:
        raise NotFound.of(noun) from None
    obj = queryset.for_org(organization).filter(pk=pk).first()
    if obj is None:
        raise NotFound.of(noun)
    return obj
