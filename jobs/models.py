from __future__ import annotations

import uuid

from django.conf import settings
from django.db import models

from anex.tenancy import OrgScopedQuerySet
from jobs.constants import FailureCode, JobStatus


class Job(models.Model):
    """A batch job: an input run through one model. Its status changes only through
    jobs.services, each change a guarded transition (STYLE.md rule 3)."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        "console.Organization", on_delete=models.PROTECT, related_name="jobs"
    )
    model = models.CharField(max_length=100)
    status = models.CharField(max_length=16, choices=JobStatus.choices,
                              default=JobStatus.SUBMITTED, db_index=True)
    created_at = models.DateTimeField(auto_now_add=True)
    approved_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    # Who approved it: the key (or console user) whose spend this job is.
    approved_by_key = models.ForeignKey(
        "console.ApiKey", null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    approved_by_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
        related_name="+",
    )
    est_cost_cents = models.PositiveBigIntegerField(null=True, blank=True)
    cost_cents = models.PositiveBigIntegerField(null=True, blank=True)
    failure_code = models.CharField(max_length=32, choices=FailureCode.choices, blank=True,
                                    default="")
    failure_reason = models.TextField(blank=True, default="")

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        indexes = [models.Index(fields=["organization", "status"])]

    def __str__(self) -> str:
        return f"{self.model} job {self.pk} ({self.status})"
