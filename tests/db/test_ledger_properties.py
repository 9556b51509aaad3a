"""Property tests: random sequences of grants, approvals (holds), settlements and releases.

Whatever the sequence: the balance is the sum of the entries and matches a plain model of
what should have happened, a hold never takes the balance below zero, and every terminal
job has no open hold.
"""

from __future__ import annotations

import pytest
from django.db import transaction
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pytest_django.fixtures import Settings as SettingsWrapper

from anex.errors import DomainError
from billing.models import LedgerEntry
from billing.services import credits_grant, credits_summary, hold_open_cents
from jobs.constants import JOB_TRANSITIONS, TERMINAL_STATUSES, JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve, job_finish
from tests.factories import SYSTEM, job_make, organization_make

JOBS = 4
grant = st.tuples(st.just("grant"), st.integers(1, 400))
approve = st.tuples(st.just("approve"), st.integers(0, JOBS - 1), st.integers(0, 300))
settle = st.tuples(st.just("settle"), st.integers(0, JOBS - 1), st.integers(0, 400),
                   st.sampled_from([JobStatus.DONE, JobStatus.FAILED, JobStatus.CANCELLED]))
operations = st.lists(st.one_of(grant, approve, settle), min_size=1, max_size=25)


@pytest.mark.django_db
@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=operations)
def test_the_ledger_always_adds_up(ops: list[tuple], settings: SettingsWrapper) -> None:  # type: ignore[type-arg]
    settings.ANEX_FREE_GRANT_CENTS = 0
    with transaction.atomic():
        run(ops)
        transaction.set_rollback(True)


def run(ops: list[tuple]) -> None:  # type: ignore[type-arg]
    organization = organization_make()
    jobs: dict[int, Job] = {}
    balance = 0
    holds: dict[int, int] = {}  # job index -> open hold, as a plain model
    for op in ops:
        if op[0] == "grant":
            credits_grant(organization=organization, cents=op[1], reason="p", actor=SYSTEM)
            balance += op[1]
        elif op[0] == "approve":
            _, index, estimate = op
            if index not in jobs:
                jobs[index] = job_make(organization, est_cost_cents=estimate)
            job = jobs[index]
            job.refresh_from_db()
            available = balance - sum(holds.values())
            try:
                job_approve(job=job, actor=SYSTEM)
            except DomainError as error:
                expected = 409 if job.status != JobStatus.COST_READY else 402
                assert error.status == expected
                assert expected == 409 or (job.est_cost_cents or 0) > available
            else:
                assert job.status == JobStatus.COST_READY
                assert (job.est_cost_cents or 0) <= available
                holds[index] = job.est_cost_cents or 0
        else:
            _, index, cost, status = op
            if index not in jobs:
                continue
            job = jobs[index]
            if status == JobStatus.DONE:  # only a job whose rows have run is done
                Job.objects.filter(pk=job.pk, status=JobStatus.IN_PROGRESS).update(
                    status=JobStatus.FINALIZING)
            job.refresh_from_db()
            moves = status in JOB_TRANSITIONS[JobStatus(job.status)]
            finished = job_finish(job=job, status=status, cost_cents=cost)
            if moves:
                charged = min(cost, holds.pop(index, 0))
                assert finished.cost_cents == charged
                balance -= charged
        check(organization, jobs, balance, holds)


def check(organization, jobs: dict[int, Job], balance: int, holds: dict[int, int]) -> None:  # type: ignore[no-untyped-def]
    credits = credits_summary(organization=organization)
    entries = LedgerEntry.objects.filter(organization=organization)
    assert credits.balance == sum(e.balance_delta for e in entries) == balance
    assert credits.held == sum(e.held_delta for e in entries) == sum(holds.values())
    assert credits.balance >= 0 and credits.available >= 0
    for index, job in jobs.items():
        job.refresh_from_db()
        if job.status in TERMINAL_STATUSES:
            assert hold_open_cents(job=job) == 0
        else:
            assert hold_open_cents(job=job) == holds.get(index, 0)
