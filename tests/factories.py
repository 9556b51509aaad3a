"""Test data made through the real services, so audit entries and hashes are real too."""

from __future__ import annotations

import itertools
import json
from typing import Any

from django.contrib.auth import get_user_model
from django.contrib.auth.models import User

from anex.regions import Region
from console.actors import Actor
from console.constants import Role
from console.models import ApiKey, Organization
from console.services import api_key_create, membership_add, organization_create
from inference.constants import InputFormat
from jobs.constants import JobStatus
from jobs.models import Input, Job
from jobs.services.inputs import input_refresh, input_upload_create
from jobs.storage import storage_for

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


def input_ready(organization: Organization, content: bytes, *, fmt: str = "jsonl",
                residency: str = "world") -> Input:
    """An uploaded input, through the real path: an upload target, the object landing in
    the region's storage, and the settle that a GET or a submit does."""
    item, _target = input_upload_create(organization=organization, actor=SYSTEM,
                                        fmt=InputFormat(fmt), residency=Region(residency))
    storage_for(residency).write_stream(item.object_key, iter([content]),
                                        max_bytes=len(content) + 1)
    return input_refresh(item=item)


def chat_request_line(custom_id: str, text: str = "hi") -> bytes:
    """One JSONL line of a chat job's input: a single user message."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/chat/completions",
                       "body": {"messages": [{"role": "user", "content": text}]}}).encode() + b"\n"
