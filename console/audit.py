"""The audit log's one write: who did what to which object (append-only)."""

from __future__ import annotations

from typing import Any

from django.db import models

from anex.requestid import current_request_id
from console.actors import Actor
from console.constants import AuditAction
from console.models import AuditEvent, Organization


def audit_record(*, organization: Organization, actor: Actor, action: AuditAction,
                 target: models.Model, data: dict[str, Any] | None = None) -> AuditEvent:
    request_id = current_request_id.get()
    return AuditEvent.objects.create(
        organization=organization,
        action=action,
        actor_key=actor.key,
        actor_user=actor.user,
        actor_label=actor.label[:255],
        target_type=target._meta.label_lower,
        target_id=str(target.pk),
        data=data or {},
        request_id="" if request_id == "-" else request_id,
    )
