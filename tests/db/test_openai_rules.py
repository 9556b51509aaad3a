"""Issue 42 item 4: the OpenAI surface on the shared rules. Its jobs' policy is stored on the
job and read by the core, which never asks which surface a job came from."""

from __future__ import annotations

import json
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from pytest_django import Settings

from anex.errors import Conflict
from anex.regions import Region
from console.actors import Actor
from console.models import Organization
from inference.rows.core import JobOptions
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.estimation import job_estimate
from jobs.services.lifecycle import job_cancel
from jobs.services.submission import JobRequest, job_submit
from openai_api.models import OpenAIBatch
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, api_key_make, input_ready, job_make

EMBED = "qwen3-embedding-8b"


@pytest.fixture(autouse=True)
def setup(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = 2


# -- the policy, stored: the core reads it, never the surface ---------------------------------

def embedding_line(custom_id: str) -> bytes:
    """An anex API row of an embedding job: the model is the job's, not named in the row."""
    return json.dumps({"custom_id": custom_id, "method": "POST", "url": "/v1/embeddings",
                       "body": {"input": "a plain text"}}).encode() + b"\n"


def test_the_policy_is_the_jobs_whoever_submits_it(
        organization: Organization, checkpoints: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    dispatch_catch(monkeypatch, lambda sent: None, "job_estimate_task", "job_start_task")
    key, _plaintext = api_key_make(organization)
    item = input_ready(organization, embedding_line("a") + embedding_line("b"))
    request = JobRequest(options=JobOptions(model=EMBED), input_id=str(item.pk))
    # given two jobs of the anex path on the same rows, one submitted with a policy
    policied = job_submit(organization=organization, actor=Actor(key=key), request=request,
                          host_region=Region.WORLD, approve_at_estimate=True,
                          collect_row_errors=True)
    plain = job_submit(organization=organization, actor=Actor(key=key), request=request,
                       host_region=Region.WORLD)
    # when each is estimated
    job_estimate(job_id=policied.pk)
    job_estimate(job_id=plain.pk)
    # then the one with no approval step is approved at once, the other waits for one;
    # neither is an OpenAI batch's, and rows naming no model pass where row_model is off
    policied.refresh_from_db()
    plain.refresh_from_db()
    assert not OpenAIBatch.objects.exists()
    assert (policied.status, policied.row_model) == (JobStatus.IN_PROGRESS, False)
    assert policied.approved_at is not None and policied.input_errors is None
    assert plain.status == JobStatus.COST_READY and plain.approved_at is None


def test_a_cancel_before_the_estimate_is_kept_only_where_there_is_no_approval_step(
        organization: Organization) -> None:
    policied = job_make(organization, status=JobStatus.ESTIMATING)
    Job.objects.filter(pk=policied.pk).update(approve_at_estimate=True)
    plain = job_make(organization, status=JobStatus.ESTIMATING)
    kept = job_cancel(job=Job.objects.get(pk=policied.pk), actor=SYSTEM)
    assert (kept.status, kept.cancel_requested) == (JobStatus.ESTIMATING, True)
    with pytest.raises(Conflict):
        job_cancel(job=Job.objects.get(pk=plain.pk), actor=SYSTEM)
    assert Job.objects.get(pk=plain.pk).cancel_requested is False


@pytest.mark.django_db(transaction=True)
def test_the_migration_gives_openai_jobs_the_policy_and_no_other_job() -> None:
    before = [("jobs", "0020_chunk_engine_failures")]
    after = [("jobs", "0021_h40oai_job_policy")]
    executor = MigrationExecutor(connection)
    executor.migrate(before)
    try:
        loader = MigrationExecutor(connection).loader
        old = loader.project_state([*before, *(node for node in loader.graph.leaf_nodes()
                                               if node[0] != "jobs")]).apps
        organization = old.get_model("console", "Organization").objects.create(name="old")
        old_job = old.get_model("jobs", "Job")
        openai_job = old_job.objects.create(organization=organization, model=EMBED,
                                            openai=True)
        anex_job = old_job.objects.create(organization=organization, model=EMBED)
        MigrationExecutor(connection).migrate(after)
        policy = ("approve_at_estimate", "collect_row_errors", "row_model")
        assert Job.objects.values_list(*policy).get(pk=openai_job.pk) == (True, True, True)
        assert Job.objects.values_list(*policy).get(pk=anex_job.pk) == (False, False, False)
        assert Job.objects.get(pk=openai_job.pk).options().row_model is True
    finally:  # the test database as every other test finds it
        latest = MigrationExecutor(connection)
        latest.migrate(latest.loader.graph.leaf_nodes())
