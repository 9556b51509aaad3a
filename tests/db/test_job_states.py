"""The sampling wait as a state of its own (jobs.constants.JobSubstate): entered through
job_transition with its JobEvent, left as estimating is left, told apart by the machine
and the recovery pass - and invisible to customers, who see estimating throughout."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from django.db import IntegrityError, transaction
from pytest_django import Settings
from rest_framework.test import APIClient

from console.models import Organization
from jobs.constants import (
    JOB_STATE_TRANSITIONS,
    JOB_TRANSITIONS,
    SUBSTATE_OF,
    JobStatus,
    JobSubstate,
    job_state_fields,
)
from jobs.models import Job, JobEvent
from jobs.selectors import job_list
from jobs.services.estimation import job_estimate
from jobs.services.lifecycle import job_transition
from jobs.services.recovery import ESTIMATE, SAMPLE
from jobs.services.sampling import SampleResult, job_sample
from tests.dispatched import Sent, dispatch_catch
from tests.factories import SYSTEM, api_key_make, input_ready, job_make, organization_make
from tests.product import product_sources

JOBS = "/batch/v1/jobs"
STATES = [*JobStatus, *JobSubstate]


@pytest.fixture(autouse=True)
def setup(settings: Settings, checkpoints: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 1000
    monkeypatch.setattr(
        "jobs.services.sampling.sample_generate",
        lambda job, model: SampleResult(max_output_tokens=20, reasoning_budget=None,
                                        tokens_per_second=1_000.0, tokens_used=100))


@pytest.fixture
def hooks(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The statuses whose webhook the machine records."""
    entered: list[str] = []
    monkeypatch.setattr("jobs.services.webhooks.job_webhook_enqueue",
                        lambda *, job, status: entered.append(status))
    return entered


@pytest.fixture
def sent(monkeypatch: pytest.MonkeyPatch) -> list[Sent]:
    calls: list[Sent] = []
    dispatch_catch(monkeypatch, calls.append, "job_sample_task")
    return calls


def events(job: Job) -> list[tuple[str, str, str]]:
    return list(JobEvent.objects.filter(job=job).values_list("from_status", "to_status",
                                                             "actor_label"))


def sampling(organization: Organization) -> Job:
    """A job in the sampling wait, entered as the estimate enters it."""
    job = job_make(organization, status=JobStatus.ESTIMATING, est_cost_cents=None,
                   model="gemma4-12b")
    moved = job_transition(job=job, to=JobSubstate.SAMPLING, actor=SYSTEM, row_count=1)
    assert moved is not None
    return moved


@pytest.mark.django_db
def test_a_job_priced_from_a_sample_waits_in_sampling_and_shows_estimating(
        api: APIClient, organization: Organization, hooks: list[str],
        sent: list[Sent]) -> None:
    # given: a chat job with no max_output_tokens, submitted and checked
    line = {"custom_id": "a", "method": "POST", "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": "Say hello."}]}}
    item = input_ready(organization, json.dumps(line).encode() + b"\n")
    response = api.post(JOBS, {"input_id": str(item.pk), "model": "gemma4-12b"}, format="json")
    job = Job.objects.get(pk=response.json()["id"])
    # when: its estimate counts the rows
    assert job_estimate(job_id=job.pk) == JobStatus.ESTIMATING
    # then: it entered the sampling wait, with its event and its sample queued ...
    job.refresh_from_db()
    assert (job.status, job.substate, job.state) == (JobStatus.ESTIMATING,
                                                     JobSubstate.SAMPLING, JobSubstate.SAMPLING)
    assert events(job)[1:] == [("submitted", "estimating", "system: worker"),
                               ("estimating", "sampling", "system: worker")]
    assert (job.claimed, job.attempts, job.row_count) == (False, 0, 1)
    assert [(m.actor, m.id) for m in sent] == [("job_sample_task", str(job.pk))]
    # ... and to the customer it is estimating: no webhook, the API and the console's
    # status filter as before
    assert hooks == ["submitted", "estimating"]
    assert api.get(f"{JOBS}/{job.pk}").json()["status"] == "estimating"
    assert list(job_list(organization=organization, status="estimating")) == [job]
    # when: the sample runs, it leaves the wait as estimating is left
    assert job_sample(job_id=job.pk) == JobStatus.COST_READY
    job.refresh_from_db()
    assert (job.status, job.substate) == (JobStatus.COST_READY, "")
    assert events(job)[-1] == ("sampling", "cost_ready", "system: worker")
    assert hooks == ["submitted", "estimating", "cost_ready"]


@pytest.mark.django_db
def test_the_api_cannot_tell_the_sampling_wait_from_estimating(
        api: APIClient, organization: Organization) -> None:
    job = sampling(organization)
    waiting = api.get(f"{JOBS}/{job.pk}").json()
    Job.objects.filter(pk=job.pk).update(substate="")  # the representation before it
    assert api.get(f"{JOBS}/{job.pk}").json() == waiting


@pytest.mark.django_db
def test_entering_the_sampling_wait_is_a_guarded_move(organization: Organization,
                                                      hooks: list[str]) -> None:
    job = job_make(organization, status=JobStatus.ESTIMATING)
    Job.objects.filter(pk=job.pk).update(claimed=True, attempts=2)
    moved = job_transition(job=job, to=JobSubstate.SAMPLING, actor=SYSTEM)
    assert moved is not None and moved.state == JobSubstate.SAMPLING
    # Its own lease starts: the sample is not taken yet.
    assert (moved.claimed, moved.attempts) == (False, 0)
    assert events(job) == [("estimating", "sampling", "system: tests")]
    assert hooks == []
    # A repeat is a no-op: no second event.
    assert job_transition(job=job, to=JobSubstate.SAMPLING, actor=SYSTEM) is None
    assert len(events(job)) == 1


@pytest.mark.django_db
@pytest.mark.parametrize("to", sorted(JOB_STATE_TRANSITIONS[JobSubstate.SAMPLING]))
def test_the_sampling_wait_is_left_as_estimating_is_left(
        organization: Organization, hooks: list[str], to: JobStatus) -> None:
    job = sampling(organization)
    moved = job_transition(job=job, to=to, actor=SYSTEM)
    assert moved is not None and (moved.status, moved.substate) == (to, "")
    assert events(job)[-1] == ("sampling", to, "system: tests")
    assert hooks == [to]  # the webhook of the status entered, as from estimating


@pytest.mark.django_db
@pytest.mark.parametrize("src,to", [
    (s, t) for s in STATES for t in STATES if t not in JOB_STATE_TRANSITIONS[s]
    and JobSubstate.SAMPLING in (s, t)])
def test_every_other_move_into_or_out_of_the_wait_is_refused(
        organization: Organization, src: Any, to: Any) -> None:
    job = job_make(organization)
    Job.objects.filter(pk=job.pk).update(**job_state_fields(src))
    assert job_transition(job=job, to=to, actor=SYSTEM) is None
    assert (Job.objects.get(pk=job.pk).state, events(job)) == (src, [])


def test_a_customer_sees_only_moves_of_the_statuses() -> None:
    """Every move of the machine shows as a move of JOB_TRANSITIONS, or as none (entering
    a substate); the statuses the API and OpenAPI list are the reference's."""
    def shown(state: Any) -> JobStatus:
        return SUBSTATE_OF.get(state, state)

    for src, targets in JOB_STATE_TRANSITIONS.items():
        for to in targets:
            assert shown(to) in JOB_TRANSITIONS[shown(src)] or (
                to in SUBSTATE_OF and shown(to) == src)
    assert {s: t & set(JobStatus) for s, t in JOB_STATE_TRANSITIONS.items()
            if s in JobStatus} == JOB_TRANSITIONS
    assert JobStatus.values == ["submitted", "estimating", "cost_ready", "in_progress",
                                "finalizing", "done", "failed", "cancelling", "cancelled"]


@pytest.mark.django_db
def test_a_substate_is_held_only_beside_its_status(organization: Organization) -> None:
    job = sampling(organization)
    with pytest.raises(IntegrityError), transaction.atomic():
        Job.objects.filter(pk=job.pk).update(status=JobStatus.COST_READY)


@pytest.mark.django_db
def test_the_recovery_pass_tells_the_two_waits_apart_by_state(
        organization: Organization) -> None:
    waiting = sampling(organization)
    counting = job_make(organization, status=JobStatus.ESTIMATING)
    Job.objects.filter(pk=counting.pk).update(row_count=1)  # counted, no sample asked
    assert list(SAMPLE.rows()) == [waiting]
    assert list(ESTIMATE.rows()) == [counting]
    # Nothing reads the row count to tell them apart any more.
    assert not [path for path in product_sources() if "row_count__isnull" in path.read_text()]


@pytest.mark.django_db
@pytest.mark.parametrize("residency,code", [("world", 409), ("eu", 200)])
def test_a_cancel_while_sampling_is_a_cancel_while_estimating(
        client_for: Any, residency: str, code: int) -> None:
    organization = organization_make(eu_data_routing=residency == "eu")
    client = client_for(api_key_make(organization)[1])
    waiting, counting = sampling(organization), job_make(organization,
                                                          status=JobStatus.ESTIMATING)
    Job.objects.filter(pk__in=[waiting.pk, counting.pk]).update(data_residency=residency)
    answers = [client.post(f"{JOBS}/{job.pk}/cancel") for job in (waiting, counting)]
    assert [a.status_code for a in answers] == [code, code]
    assert answers[0].json() == answers[1].json() | (
        {"id": str(waiting.pk)} if code == 200 else {})
    if code == 200:
        assert events(waiting)[-1][:2] == ("sampling", "cancelled")
