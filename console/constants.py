from django.db import models


class Role(models.TextChoices):
    OWNER = "owner", "Owner"
    MEMBER = "member", "Member"


class AuditAction(models.TextChoices):
    ORGANIZATION_CREATED = "organization.created"
    ORGANIZATION_UPDATED = "organization.updated"
    WEBHOOK_ENDPOINT_SET = "webhook.endpoint_set"
    WEBHOOK_SECRET_ROTATED = "webhook.secret_rotated"  # noqa: S105 - an action name
    WEBHOOK_TEST_SENT = "webhook.test_sent"
    MEMBER_ADDED = "member.added"
    MEMBER_INVITED = "member.invited"
    MEMBER_REMOVED = "member.removed"
    MEMBER_ROLE_CHANGED = "member.role_changed"
    MEMBER_SPEND_LIMIT_SET = "member.spend_limit_set"
    INVITATION_REVOKED = "member.invitation_revoked"
    API_KEY_CREATED = "api_key.created"
    API_KEY_REVOKED = "api_key.revoked"
    CREDITS_GRANTED = "credits.granted"
    CREDITS_TOPPED_UP = "credits.topped_up"
    CREDITS_REVERSED = "credits.reversed"  # a Stripe refund or dispute took a top-up back
    CREDITS_REINSTATED = "credits.reinstated"  # a won dispute gave it back
    JOB_APPROVED = "job.approved"
    INPUT_CREATED = "input.created"
    JOB_SUBMITTED = "job.submitted"
    JOB_CANCELLED = "job.cancelled"
