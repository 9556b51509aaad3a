"""Race tests (docs/dev/style.md rule 10): concurrent callers on real connections, one outcome."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from django.db import connection
from django.test import Client
from pytest_django.fixtures import Settings as SettingsWrapper

from anex.errors import DomainError
from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_grant, credits_summary
from jobs.constants import JobStatus
from jobs.models import Job
from jobs.services.lifecycle import job_approve, job_finish
from tests.factories import SYSTEM, job_make, organization_make
from tests.stripe_helpers import WEBHOOK_SECRET, checkout_completed_event, signed_headers

pytestmark = pytest.mark.django_db(transaction=True)
THREADS = 20


def race(worker: Callable[[], Any]) -> list[Any]:
    """Run `worker` in THREADS threads released at once; each has its own connection."""
    barrier = threading.Barrier(THREADS)
    results: list[Any] = []
    lock = threading.Lock()

    def run() -> None:
        try:
            barrier.wait(30)  # one that never arrives fails the test, not hangs it
            outcome: Any = worker()
        except Exception as exc:  # collected and asserted on below
            outcome = exc
        finally:
            connection.close()
        with lock:
            results.append(outcome)

    threads = [threading.Thread(target=run) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    return results


def test_twenty_concurrent_approvals_place_exactly_one_hold(settings: SettingsWrapper) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    credits_grant(organization=organization, cents=1000, reason="race", actor=SYSTEM)
    job = job_make(organization, est_cost_cents=700)

    results = race(lambda: job_approve(job=job, actor=SYSTEM))

    approved = [r for r in results if not isinstance(r, Exception)]
    refused = [r for r in results if isinstance(r, DomainError)]
    assert len(approved) == 1 and len(refused) == THREADS - 1, results
    assert {r.status for r in refused} == {409}
    assert LedgerEntry.objects.filter(job=job, kind=EntryKind.HOLD).count() == 1
    assert credits_summary(organization=organization).held == 700
    job.refresh_from_db()
    assert job.status == JobStatus.IN_PROGRESS


def test_twenty_redeliveries_of_one_stripe_event_credit_once(settings: SettingsWrapper) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    settings.STRIPE_WEBHOOK_SECRET = WEBHOOK_SECRET
    organization = organization_make()
    payload = json.dumps(checkout_completed_event(organization, cents=2500)).encode()
    headers = signed_headers(payload, timestamp=int(time.time()))

    def deliver() -> int:
        response = Client().post("/billing/stripe/webhook", payload,
                                 content_type="application/json", headers=headers)
        return response.status_code

    results = race(deliver)

    assert results == [200] * THREADS, results
    assert credits_summary(organization=organization).balance == 2500
    assert LedgerEntry.objects.filter(organization=organization,
                                      kind=EntryKind.TOPUP).count() == 1


def test_twenty_concurrent_settlements_charge_and_release_once(settings: SettingsWrapper) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    organization = organization_make()
    credits_grant(organization=organization, cents=1000, reason="race", actor=SYSTEM)
    job = job_approve(job=job_make(organization, est_cost_cents=600), actor=SYSTEM)
    Job.objects.filter(pk=job.pk).update(status=JobStatus.FINALIZING)  # its rows have run

    results = race(lambda: job_finish(job=job, status=JobStatus.DONE, cost_cents=250))

    assert not [r for r in results if isinstance(r, Exception)], results
    assert {r.cost_cents for r in results} == {250}
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds == ["charge", "hold", "release"]
    assert credits_summary(organization=organization).balance == 750
    assert credits_summary(organization=organization).held == 0
