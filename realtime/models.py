from __future__ import annotations

from django.conf import settings
from django.db import models

from console.tenancy import OrgScopedQuerySet
from realtime.constants import SWITCH_ID, Endpoint


class RealtimeSwitch(models.Model):
    """The operator's switch for the realtime API (one row, edited in the admin): while
    `frozen`, every realtime request is answered 503 with Retry-After and nothing reaches
    an engine or the ledger."""

    id = models.PositiveSmallIntegerField(primary_key=True, default=SWITCH_ID, editable=False)
    frozen = models.BooleanField(
        default=False, help_text="Answer every realtime request 503 (maintenance).")
    reason = models.CharField(max_length=500, blank=True, default="",
                              help_text="For the staff: why it is frozen (never shown to "
                                        "customers).")
    changed_at = models.DateTimeField(null=True, blank=True)
    changed_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True,
                                   on_delete=models.SET_NULL, related_name="+")

    class Meta:
        verbose_name = "realtime switch"

    def __str__(self) -> str:
        return "realtime API frozen" if self.frozen else "realtime API open"


class RealtimeUsage(models.Model):
    """One answered realtime request: what it read, and what it cost exactly at the model's
    realtime rate. Append-only, one INSERT per request (no lock, no read), so requests of
    one key never wait on each other; the ledger is charged from these rows in whole
    credits by realtime.services.settlement.realtime_charges_settle."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey("console.Organization", on_delete=models.PROTECT,
                                     related_name="+")
    api_key = models.ForeignKey("console.ApiKey", on_delete=models.PROTECT, related_name="+")
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices)
    model = models.CharField(max_length=100)
    input_tokens = models.PositiveBigIntegerField()
    cost_usd = models.DecimalField(max_digits=30, decimal_places=12)
    request_id = models.CharField(max_length=64, blank=True, default="")
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # Charged to the ledger (realtime_charges_settle sets it in the statement that sums the
    # row); a settled row is rolled up into RealtimeUsageDaily and purged after
    # ANEX_REALTIME_USAGE_RETENTION_DAYS.
    settled = models.BooleanField(default=False)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        verbose_name_plural = "realtime usage"
        indexes = [
            models.Index(fields=["api_key", "id"], name="realtime_usage_key_id"),
            # What the settlement reads: the unsettled rows alone, however many are settled.
            models.Index(fields=["api_key", "created_at"], name="realtime_usage_unsettled",
                         condition=models.Q(settled=False)),
        ]

    def __str__(self) -> str:
        return f"{self.endpoint} {self.model} {self.input_tokens} tokens"


class RealtimeSettlement(models.Model):
    """How far a key's realtime usage has been charged to the ledger: its usage rows up to
    `through_usage_id` cost `metered_usd` in all, exactly, and the ledger has charged
    `charged_cents` for them, floor(metered_usd in cents). Append-only, one row per
    settlement that found new usage, written under the organization lock; the next
    settlement starts from the key's last one."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey("console.Organization", on_delete=models.PROTECT,
                                     related_name="+")
    api_key = models.ForeignKey("console.ApiKey", on_delete=models.PROTECT, related_name="+")
    through_usage_id = models.BigIntegerField()
    metered_usd = models.DecimalField(max_digits=30, decimal_places=12)
    charged_cents = models.BigIntegerField()
    created_at = models.DateTimeField(auto_now_add=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-id"]
        constraints = [
            # A settlement covers each stretch of a key's usage once.
            models.UniqueConstraint(fields=["api_key", "through_usage_id"],
                                    name="realtime_settlement_key_through"),
        ]

    def __str__(self) -> str:
        return f"{self.charged_cents} credits through usage {self.through_usage_id}"


class RealtimeUsageDaily(models.Model):
    """A key's settled realtime usage of one model on one endpoint on one (UTC) day: what
    the usage rows it sums said, kept once they are purged. Written by the settlement,
    under the organization lock, as it marks the rows settled."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey("console.Organization", on_delete=models.PROTECT,
                                     related_name="+")
    api_key = models.ForeignKey("console.ApiKey", on_delete=models.PROTECT, related_name="+")
    day = models.DateField()
    endpoint = models.CharField(max_length=16, choices=Endpoint.choices)
    model = models.CharField(max_length=100)
    requests = models.PositiveBigIntegerField(default=0)
    input_tokens = models.PositiveBigIntegerField(default=0)
    cost_usd = models.DecimalField(max_digits=30, decimal_places=12, default=0)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-day", "id"]
        verbose_name_plural = "realtime usage by day"
        constraints = [
            models.UniqueConstraint(fields=["api_key", "day", "endpoint", "model"],
                                    name="realtime_usage_daily_one"),
        ]

    def __str__(self) -> str:
        return f"{self.day} {self.endpoint} {self.model}: {self.requests} requests"
