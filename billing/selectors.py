from __future__ import annotations

import uuid
from dataclasses import dataclass

from django.db.models import Q, QuerySet, Sum
from django.db.models.functions import Coalesce

from billing.constants import EntryKind
from billing.models import LedgerEntry
from console.models import Organization


def ledger_entry_list(*, organization: Organization) -> QuerySet[LedgerEntry]:
    return LedgerEntry.objects.for_org(organization).select_related("job")


@dataclass(frozen=True)
class JobMoney:
    """A job's credits as its ledger entries moved them: the hold its approval placed,
    what it was charged and what was released (both 0 until it settles)."""

    held: int
    charged: int
    released: int

    @property
    def settled(self) -> bool:
        return bool(self.charged or self.released)


def job_money(*, job_id: uuid.UUID) -> JobMoney:
    """One aggregate over the job's entries (the job is read through its organization's
    scope by the caller)."""
    sums = LedgerEntry.objects.filter(job_id=job_id).aggregate(
        held=Coalesce(Sum("held_delta", filter=Q(kind=EntryKind.HOLD)), 0),
        charged=Coalesce(Sum("balance_delta", filter=Q(kind=EntryKind.CHARGE)), 0),
        released=Coalesce(Sum("held_delta", filter=Q(kind=EntryKind.RELEASE)), 0))
    return JobMoney(held=int(sums["held"]), charged=-int(sums["charged"]),
                    released=-int(sums["released"]))
