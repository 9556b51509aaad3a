"""anex.internals.prepared.PreparedSelect and console.tenancy.ScopedGet: what the ORM's
first() reads and builds, compiled once; and GET /jobs/{id} read through them
(jobs.selectors.job_read)."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from rest_framework.test import APIClient

from anex.errors import NotFound
from anex.internals.prepared import PreparedSelect
from console.models import ApiKey, Organization
from console.tenancy import ScopedGet, scoped_get
from jobs.constants import FailureCode, JobStatus
from jobs.models import Job
from jobs.selectors import job_progress, job_read
from jobs.serializers import JobOut, ProgressOut
from tests.factories import api_key_make, job_make, organization_make

pytestmark = pytest.mark.django_db

JOBS = "/batch/v1/jobs"


def _fields_equal(found: object, orm: object) -> None:
    for field in type(orm)._meta.concrete_fields:  # type: ignore[attr-defined]
        assert getattr(found, field.attname) == getattr(orm, field.attname), field.name


def test_it_builds_what_the_orm_builds_with_its_related_objects_and_annotations() -> None:
    key, _ = api_key_make(model_scopes=["laya"], spend_budget_cents=500,
                          expires_at=timezone.now() + timedelta(days=1))
    select = PreparedSelect(lambda prefix: ApiKey.objects.select_related("organization")
                            .filter(prefix=prefix, revoked_at__isnull=True).order_by(),
                            sentinels=("a prefix",))
    orm = ApiKey.objects.select_related("organization").get(pk=key.pk)
    # when it is read twice through the compiled query
    with CaptureQueriesContext(connection) as queries:
        first, second = select.first(key.prefix), select.first(key.prefix)
        assert first is not None and second is not None
        organization = first.organization  # already read, with the key
    # then each read is one query, and gives the ORM's key and organization
    assert len(queries) == 2
    for found in (first, second):
        _fields_equal(found, orm)
        _fields_equal(found.organization, orm.organization)
        assert not found._state.adding and found._state.db == "default"
    assert organization is first.organization and first is not second
    assert select.first("no such prefix") is None


def test_a_query_must_take_each_sentinel_exactly_once() -> None:
    with pytest.raises(ValueError):
        PreparedSelect(lambda a, b: Job.objects.filter(model=a), sentinels=("x", "x"))
    unused = PreparedSelect(lambda a, b: Job.objects.filter(model=a).order_by(),
                            sentinels=("x", "y"))
    with pytest.raises(TypeError):
        unused.first("m", "n")


def test_a_scoped_get_is_the_same_object_or_the_same_404_as_scoped_get(
        organization: Organization) -> None:
    job = job_make(organization)
    other = organization_make()
    get = ScopedGet(lambda: Job.objects.all(), noun="Job")
    _fields_equal(get(organization=organization, id=str(job.pk)),
                  scoped_get(Job.objects.all(), organization=organization, id=job.pk,
                             noun="Job"))
    for organization_asked, asked in ((other, job.pk), (organization, uuid.uuid4()),
                                      (organization, "not-a-uuid")):
        with pytest.raises(NotFound) as refused:
            get(organization=organization_asked, id=asked)
        with pytest.raises(NotFound) as refused_too:
            scoped_get(Job.objects.all(), organization=organization_asked, id=asked,
                       noun="Job")
        assert str(refused.value) == str(refused_too.value)


def test_a_job_read_answers_what_the_serializer_answers_in_one_query(
        organization: Organization) -> None:
    # given an ordinary job, a failed one echoing max_tokens, and a re-run parent and child
    plain = job_make(organization)
    failed = job_make(organization, status=JobStatus.FAILED)
    Job.objects.filter(pk=failed.pk).update(
        failure_code=FailureCode.INVALID_INPUT, failure_reason="no rows",
        max_tokens_alias=True, max_output_tokens_requested=64, max_output_tokens=64)
    parent = job_make(organization, status=JobStatus.DONE)
    children = [Job.objects.create(organization=organization, model=parent.model,
                                   parent=parent, status=JobStatus.SUBMITTED)
                for _ in range(2)]
    for job in (plain, failed, parent, *children):
        orm = Job.objects.get(pk=job.pk)
        # when it is read as GET /jobs/{id} reads it
        with CaptureQueriesContext(connection) as queries:
            read = job_read(organization=organization, id=job.pk)
            answer = JobOut.answer(read)
        # then one query, and the answer the serializer gives on the ORM's job
        assert len(queries) == 1
        _fields_equal(read, orm)
        assert answer == JobOut(orm).data
    assert JobOut.answer(job_read(organization=organization, id=parent.pk))["children"] == [
        str(child.pk) for child in children]


def test_the_job_poll_through_the_api(api: APIClient, organization: Organization) -> None:
    parent = job_make(organization, status=JobStatus.DONE)
    child = Job.objects.create(organization=organization, model=parent.model, parent=parent)
    assert api.get(f"{JOBS}/{parent.pk}").json() == JobOut(Job.objects.get(pk=parent.pk)).data
    assert api.get(f"{JOBS}/{child.pk}").json()["parent_id"] == str(parent.pk)
    assert api.get(f"{JOBS}/{job_make().pk}").status_code == 404
    assert api.get(f"{JOBS}/not-a-uuid").status_code == 404


def test_the_progress_poll_answers_what_its_serializer_answers(
        organization: Organization) -> None:
    job = job_make(organization, status=JobStatus.IN_PROGRESS)
    progress = job_progress(organization=organization, id=job.pk)
    assert ProgressOut.answer(progress) == ProgressOut(progress).data


def test_a_batch_is_read_with_its_job_and_file_as_the_orm_reads_it(
        organization: Organization) -> None:
    from openai_api.batches import batch_get, batch_object
    from openai_api.models import FilePurpose, OpenAIBatch, OpenAIFile

    file = OpenAIFile.objects.create(organization=organization, purpose=FilePurpose.BATCH,
                                     filename="in.jsonl", bytes=10)
    ran = OpenAIBatch.objects.create(organization=organization, input_file=file,
                                     endpoint="/v1/embeddings", metadata={"a": "b"},
                                     job=job_make(organization))
    refused = OpenAIBatch.objects.create(organization=organization, input_file=file,
                                         endpoint="/v1/embeddings", job=None,
                                         errors=[{"code": "x", "message": "y"}])
    for batch in (ran, refused):
        orm = OpenAIBatch.objects.select_related("job", "input_file").get(pk=batch.pk)
        with CaptureQueriesContext(connection) as queries:
            read = batch_get(organization=organization, id=batch.pk)
            job, input_file = read.job, read.input_file
        assert len(queries) == 1
        _fields_equal(read, orm)
        _fields_equal(input_file, orm.input_file)
        if orm.job is None:
            assert job is None
        else:
            _fields_equal(job, orm.job)
        assert batch_object(read) == batch_object(orm)
    for organization_asked, asked in ((organization_make(), ran.pk),
                                      (organization, "batch_none")):
        with pytest.raises(NotFound):
            batch_get(organization=organization_asked, id=asked)
