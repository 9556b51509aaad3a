from __future__ import annotations

from django.db.models import QuerySet

from billing.models import LedgerEntry
from console.models import Organization


def ledger_entry_list(*, organization: Organization) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.for_org(organization).select_related("job")
