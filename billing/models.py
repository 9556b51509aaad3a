from __future__ import annotations

from django.conf import settings
from django.db import models
from django.db.models import Q

from billing.constants import EntryKind
from console.tenancy import OrgScopedQuerySet


class LedgerEntry(models.Model):
    """One movement of credits (1 credit = 1 US cent). Append-only: the database refuses
    UPDATE and DELETE, and every total is a SUM over these rows (docs/dev/style.md rule 4).

    balance_delta moves the balance (grants and top-ups in, charges out); held_delta moves
    the part of it reserved by approved jobs (holds in, releases and charges out). What an
    organization can spend is balance - held.
    """

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.PROTECT, related_name="ledger_entries"
    )
    kind = models.CharField(max_length=16, choices=EntryKind.choices)
    balance_delta = models.BigIntegerField(default=0)
    held_delta = models.BigIntegerField(default=0)
    # Unique: a retried or concurrent write of the same movement cannot land twice.
    idempotency_key = models.CharField(max_length=200, unique=True)
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # The cause: a job, a Stripe event, a staff user (or the system, with a reason).
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.PROTECT,
                            related_name="ledger_entries")
    api_key = models.ForeignKey("console.ApiKey", null=True, blank=True,
                                on_delete=models.PROTECT, related_name="+",
                                help_text="The key whose spend budget this counts against.")
    stripe_event_id = models.CharField(max_length=255, blank=True, default="")
    # A top-up's PaymentIntent: how a later refund or dispute of its charge finds the
    # organization and the amount it may reverse.
    stripe_payment_intent = models.CharField(max_length=255, blank=True, default="",
                                             db_index=True)
    staff_user = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.PROTECT, related_name="+")
    reason = models.CharField(max_length=500, blank=True, default="")

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        verbose_name_plural = "ledger entries"
        constraints = [
            # The sign rules per kind, so no code path can write a nonsense entry.
            models.CheckConstraint(
                name="ledger_kind_signs",
                condition=(
                    Q(kind__in=[EntryKind.GRANT, EntryKind.TOPUP, EntryKind.REFUND],
                      balance_delta__gt=0, held_delta=0)
                    | Q(kind=EntryKind.HOLD, balance_delta=0, held_delta__gt=0)
                    | Q(kind=EntryKind.RELEASE, balance_delta=0, held_delta__lt=0)
                    | Q(kind=EntryKind.CHARGE, balance_delta__lt=0, held_delta__lte=0,
                        held_delta__gte=models.F("balance_delta"))
                    | Q(kind=EntryKind.ADJUSTMENT, held_delta=0)
                ),
            ),
            models.CheckConstraint(
                name="ledger_job_entries_have_a_job",
                condition=~Q(kind__in=[EntryKind.HOLD, EntryKind.RELEASE])
                | Q(job__isnull=False),
            ),
        ]
        indexes = [models.Index(fields=["organization", "kind"])]

    def __str__(self) -> str:
        return f"{self.kind} {self.balance_delta:+d}/{self.held_delta:+d} ({self.idempotency_key})"
