from __future__ import annotations

import uuid

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from console.constants import Role
from console.keys import key_display
from console.tenancy import OrgScopedQuerySet


class Organization(models.Model):
    """The tenant: owns keys, jobs, inputs, credits and these settings."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)
    webhook_url = models.URLField(max_length=2000, blank=True, default="")
    # The endpoint's signing secret, encrypted (anex/crypto.py): it must be read back to
    # sign and to show to owners. After a rotation the previous one keeps signing beside
    # it until webhook_secret_previous_until, so a receiver can switch without a gap.
    webhook_secret_encrypted = models.TextField(blank=True, default="")
    webhook_secret_previous_encrypted = models.TextField(blank=True, default="")
    webhook_secret_previous_until = models.DateTimeField(null=True, blank=True)
    auto_approve = models.BooleanField(
        default=False,
        help_text="Approve every estimate at cost_ready as if the API call were made.",
    )
    eu_data_routing = models.BooleanField(
        default=False, help_text="Keep this organization's data in the EEA (turned on by staff)."
    )
    progress_webhooks = models.BooleanField(
        default=False,
        help_text="Also send a `progress` webhook at 25, 50 and 75 % of a job's rows.",
    )
    # The stored-input quota (jobs.services.quota), set by staff on request; empty: the
    # deployment's ANEX_STORED_INPUTS_MAX / ANEX_STORED_INPUT_BYTES_MAX.
    stored_inputs_max = models.PositiveIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Inputs it may keep at once (empty: the deployment's default).")
    stored_input_bytes_max = models.PositiveBigIntegerField(
        null=True, blank=True, validators=[MinValueValidator(1)],
        help_text="Bytes of inputs it may keep at once (empty: the deployment's default).")

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return self.name


class Membership(models.Model):
    user = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships"
    )
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="memberships"
    )
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    created_at = models.DateTimeField(auto_now_add=True)
    # What a member may commit in all (console.services.member_spend_require): the budgets
    # of their active keys, what their other keys spent and what their console approvals
    # held and charged. Set by an owner; None is no limit. Owners are never held to it.
    spend_limit_cents = models.PositiveBigIntegerField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["user", "organization"], name="membership_unique"),
        ]

    def __str__(self) -> str:
        return f"{self.user} in {self.organization} ({self.role})"


class ApiKey(models.Model):
    """An organization's API key. The secret is never stored, only its digest."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="api_keys"
    )
    name = models.CharField(max_length=200, blank=True, default="")
    prefix = models.CharField(max_length=16, unique=True)
    secret_hash = models.CharField(max_length=64)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    # Empty means every model; otherwise the catalog ids this key may list and use.
    model_scopes = ArrayField(models.CharField(max_length=100), default=list, blank=True)
    spend_budget_cents = models.PositiveBigIntegerField(null=True, blank=True)
    rate_limit_per_minute = models.PositiveIntegerField(null=True, blank=True)

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.display} ({self.name})" if self.name else self.display

    @property
    def display(self) -> str:
        return key_display(self.prefix)

    @property
    def is_active(self) -> bool:
        """Neither revoked nor expired: a key that is not answers 401 when it is presented,
        and no longer approves for the jobs it submitted (auto-approve)."""
        return self.revoked_at is None and (self.expires_at is None
                                            or self.expires_at > timezone.now())

    def allows(self, model_id: str) -> bool:
        """Whether this key may use the model: list it, submit and approve jobs on it, send
        it realtime requests. No scopes means every model."""
        return not self.model_scopes or model_id in self.model_scopes


class AuditEvent(models.Model):
    """One action and who performed it. Append-only: the database refuses UPDATE/DELETE."""

    id = models.BigAutoField(primary_key=True)
    organization = models.ForeignKey(
        Organization, on_delete=models.PROTECT, related_name="audit_events"
    )
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)
    # An AuditAction value; not a `choices` field, so a new action needs no migration.
    action = models.CharField(max_length=64, db_index=True)
    actor_key = models.ForeignKey(
        ApiKey, null=True, blank=True, on_delete=models.PROTECT, related_name="+"
    )
    actor_user = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.PROTECT,
        related_name="+",
    )
    # A readable snapshot of who it was ("key sk-…", "user a@b.c", "system: createorg"),
    # so the record reads the same whatever later happens to the key or user.
    actor_label = models.CharField(max_length=255)
    target_type = models.CharField(max_length=64)
    target_id = models.CharField(max_length=64)
    data = models.JSONField(default=dict, blank=True)
    request_id = models.CharField(max_length=64, blank=True, default="")

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(
                condition=~(models.Q(actor_key__isnull=False) & models.Q(actor_user__isnull=False)),
                name="audit_one_actor",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.action} by {self.actor_label}"


class Invitation(models.Model):
    """An owner's invitation of an email address into the organization. Only a digest of
    its token is stored; the link in the mail carries the token, and whoever accepts it
    must be signed in with that address verified."""

    id = models.UUIDField(primary_key=True, default=uuid.uuid4, editable=False)
    organization = models.ForeignKey(
        Organization, on_delete=models.CASCADE, related_name="invitations"
    )
    email = models.EmailField()
    role = models.CharField(max_length=16, choices=Role.choices, default=Role.MEMBER)
    token_hash = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    accepted_at = models.DateTimeField(null=True, blank=True)
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
        related_name="+",
    )

    objects = OrgScopedQuerySet.as_manager()

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.email} to {self.organization} ({self.role})"


class StaffEnrolment(models.Model):
    """A one-time code that lets one staff account set up its authenticator app (issue 40
    L10): issued from a shell (`manage.py staffenrol`) and handed over apart from the
    account's password and mailbox, so whoever first holds a staff password cannot make
    the second factor their own. Only the code's digest is stored."""

    id = models.BigAutoField(primary_key=True)
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE,
                             related_name="+")
    code_hash = models.CharField(max_length=64, unique=True)
    issued_by = models.CharField(max_length=255)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField()
    used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"enrolment of {self.user} ({self.created_at:%Y-%m-%d %H:%M})"
