"""Every scoped read in the jobs app (STYLE.md rule 2)."""

from __future__ import annotations

import uuid

from anex.tenancy import scoped_get
from console.models import Organization
from jobs.models import Input, Job


def input_get(*, organization: Organization, id: uuid.UUID | str) -> Input:
    return scoped_get(Input.objects.all(), organization=organization, id=id, noun="Input")


def job_get(*, organization: Organization, id: uuid.UUID | str) -> Job:
    return scoped_get(Job.objects.all(), organization=organization, id=id, noun="Job")
