"""Test data made through the real services, so audit entries and hashes are real too."""

from __future__ import annotations

import itertools
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

from console.actors import Actor
from console.constants import Role
from console.models import ApiKey, Organization
from console.services import api_key_create, membership_add, organization_create
from jobs.constants import JobStatus
from jobs.models import Job

_counter = itertools.count(1)
SYSTEM = Actor(system="tests")


def organization_make(**options: Any) -> Organization:
    options.setdefault("name", f"org-{next(_counter)}")
    return organization_create(actor=SYSTEM, **options)


def api_key_make(organization: Organization | None = None, **options: Any) -> tuple[ApiKey, str]:
    return api_key_create(organization=organization or organization_make(), actor=SYSTEM,
                          **options)


def user_make(organization: Organization | None = None, role: Role = Role.OWNER,
              **options: Any) -> User:
    n = next(_counter)
    options.setdefault("username", f"user{n}")
    options.setdefault("email", f"user{n}@example.com")
    user = get_user_model().objects.create_user(password="correct horse battery", **options)
    if organization is not None:
        membership_add(organization=organization, user=user, role=role, actor=SYSTEM)
    return user


def job_make(organization: Organization | None = None, *, status: JobStatus = JobStatus.COST_READY,
             est_cost_cents: int | None = 50, model: str = "qwen3-embedding-8b") -> Job:
    """A job as the estimator leaves it (the submit and estimate services are the jobs
    issue's); its lifecycle from here on goes through jobs.services."""
    return Job.objects.create(organization=organization or organization_make(), model=model,
                              status=status, est_cost_cents=est_cost_cents)
