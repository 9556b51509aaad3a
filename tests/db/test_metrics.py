"""GET /metrics (anex/metrics.py): the fleet's figures read from the database grow by a job
that runs, Dramatiq's queues are counted in Redis, requests are counted by route, nobody
but a loopback caller or the token's bearer reads it, and no label names a tenant."""

from __future__ import annotations

import functools
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from django.test import Client
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample
from pytest_django import Settings

from anex.metrics import ENDED, SETTLED_AFTER
from console.models import Organization
from inference.catalog import catalog_all
from inference.constants import RowOutcome
from inference.pricing import Usage
from jobs import dispatch
from jobs.constants import JobStatus
from jobs.models import Chunk, Job
from jobs.services.chunks import chunk_claim
from jobs.services.lifecycle import job_approve
from jobs.services.recovery import LEASES, lease_recover
from jobs.services.running import job_finalize, job_start, job_usage
from tests.chunks import chunk_done, row_record
from tests.factories import SYSTEM, api_key_make, chat_request_line, input_ready, job_make

pytestmark = pytest.mark.django_db
ROOT = Path(__file__).resolve().parents[2]
MODEL = "gemma4-12b"
TENANT_LABELS = {"organization", "organization_id", "org", "key", "api_key", "key_id", "job",
                 "job_id", "user", "tenant"}


@pytest.fixture(autouse=True)
def fresh(settings: Settings) -> Iterator[None]:
    settings.ANEX_FREE_GRANT_CENTS = 100_000
    settings.ANEX_CHUNK_ROWS = 100
    # The jobs that ended long ago are added up once per process: each test's database
    # starts empty, so each starts from nothing.
    ENDED.reset()
    yield
    ENDED.reset()


def scrape() -> str:
    response = Client().get("/metrics")
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    return response.content.decode()


@functools.lru_cache(maxsize=4)
def samples(text: str) -> tuple[Sample, ...]:
    """A scrape's samples, parsed once for the several values a test reads off it."""
    return tuple(sample for family in text_string_to_metric_families(text)
                 for sample in family.samples)


def value(text: str, name: str, **labels: str) -> float:
    found = [s.value for s in samples(text) if s.name == name and s.labels == labels]
    assert len(found) <= 1, found
    return found[0] if found else 0.0


def outcome_of(index: int) -> RowOutcome:
    return (RowOutcome.ERROR if index % 17 == 3 else RowOutcome.TRUNCATED if index % 23 == 5
            else RowOutcome.FORMAT_ERROR if index % 29 == 7 else RowOutcome.SUCCESS)


def job_run(organization: Organization, rows: int) -> Job:
    """A job through approval, its chunks claimed as a worker claims them and settled as a
    worker's run settles them (no engine), and its finalize."""
    item = input_ready(organization, b"".join(chat_request_line(f"r{i}") for i in range(rows)))
    job = job_make(organization, est_cost_cents=5000, model=MODEL)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=rows, max_output_tokens=50)
    job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    job_start(job_id=job.pk)
    for chunk in Chunk.objects.filter(job=job).order_by("index"):
        assert chunk_claim(chunk_id=chunk.pk)
        chunk_done(chunk, [row_record(i, f"r{i}", outcome_of(i),
                                      Usage(input_tokens=10 + i, output_tokens=3),
                                      answer=f"a{i}")
                           for i in range(chunk.first_row, chunk.first_row + chunk.row_count)])
    assert job_finalize(job_id=job.pk) == JobStatus.DONE
    job.refresh_from_db()
    return job


def test_a_job_that_runs_grows_the_job_row_and_token_counters(
        organization: Organization) -> None:
    # given a scrape before the job
    before = scrape()
    # when a job of 150 rows runs to the end
    job = job_run(organization, 150)
    after = scrape()

    # then the jobs ended, by status, grew by it
    assert value(after, "anex_jobs_total", status="done") == \
        value(before, "anex_jobs_total", status="done") + 1
    for status in ("failed", "cancelled", "expired"):
        assert value(after, "anex_jobs_total", status=status) == \
            value(before, "anex_jobs_total", status=status)
    # its rows, by outcome, as the job counted them
    counted = {"success": job.success_rows or 0, "error": job.error_rows or 0,
               "format_error": job.format_error_rows or 0,
               "truncated": job.truncated_rows or 0}
    assert sum(counted.values()) == 150 and all(counted.values())
    for outcome, rows in counted.items():
        assert value(after, "anex_rows_total", model=MODEL, outcome=outcome) == \
            value(before, "anex_rows_total", model=MODEL, outcome=outcome) + rows
    # its tokens, as it billed them
    usage = job_usage(job)
    assert value(after, "anex_tokens_total", model=MODEL, kind="prompt") == \
        value(before, "anex_tokens_total", model=MODEL, kind="prompt") + usage.input_tokens
    assert value(after, "anex_tokens_total", model=MODEL, kind="completion") == \
        value(before, "anex_tokens_total", model=MODEL, kind="completion") + \
        usage.output_tokens
    # and one observation in each histogram (150 rows: the 1k class), in the +Inf bucket
    # and every bucket over its duration
    assert value(after, "anex_job_queue_wait_seconds_count") == \
        value(before, "anex_job_queue_wait_seconds_count") + 1
    assert value(after, "anex_job_queue_wait_seconds_bucket", le="10.0") == \
        value(before, "anex_job_queue_wait_seconds_bucket", le="10.0") + 1
    assert value(after, "anex_job_processing_seconds_count", size="le1k") == \
        value(before, "anex_job_processing_seconds_count", size="le1k") + 1
    assert value(after, "anex_job_processing_seconds_bucket", size="le1k", le="+Inf") == \
        value(before, "anex_job_processing_seconds_bucket", size="le1k", le="+Inf") + 1
    assert value(after, "anex_job_processing_seconds_count", size="le100") == \
        value(before, "anex_job_processing_seconds_count", size="le100")
    assert value(after, "anex_metrics_source_up", source="database") == 1


def test_jobs_that_ended_long_ago_are_added_up_once_and_still_counted(
        organization: Organization) -> None:
    # given a job that ended before the settled horizon, and one that just did
    old = job_run(organization, 3)
    Job.objects.filter(pk=old.pk).update(finished_at=timezone.now() - SETTLED_AFTER * 3)
    job_run(organization, 2)
    # then both are counted, on the first scrape and on the next (the old one from what
    # the process added up, not read twice)
    for _ in range(2):
        assert value(scrape(), "anex_jobs_total", status="done") == 2
        assert ENDED._through is not None


def test_a_job_expired_unapproved_is_counted_expired(organization: Organization) -> None:
    # given an estimate left waiting past its approval window
    job = job_make(organization)
    Job.objects.filter(pk=job.pk).update(cost_ready_at=timezone.now() - timedelta(hours=25),
                                         leased_at=timezone.now() - timedelta(hours=25))
    before = scrape()
    assert value(before, "anex_jobs_awaiting_approval") == 1
    # when the recovery pass expires it
    for lease in LEASES:
        lease_recover(lease, timezone.now())
    job.refresh_from_db()
    assert job.status == JobStatus.CANCELLED
    # then it counts as expired, not cancelled, and no longer waits
    after = scrape()
    assert value(after, "anex_jobs_total", status="expired") == 1
    assert value(after, "anex_jobs_total", status="cancelled") == 0
    assert value(after, "anex_jobs_awaiting_approval") == 0


def test_chunks_in_flight_and_the_queues_are_counted(organization: Organization) -> None:
    # given a started job of 250 rows: three chunks sent to the model's run queue
    item = input_ready(organization, b"".join(chat_request_line(f"r{i}") for i in range(250)))
    job = job_make(organization, est_cost_cents=5000, model=MODEL)
    Job.objects.filter(pk=job.pk).update(input=item, row_count=250, max_output_tokens=50)
    job_approve(job=Job.objects.get(pk=job.pk), actor=SYSTEM)
    queue = dispatch.run_queue("world", MODEL)
    before = value(scrape(), "anex_queue_depth", queue=queue)
    job_start(job_id=job.pk)
    dispatch.send("job_estimate_task", "00000000-0000-0000-0000-000000000000")
    text = scrape()
    in_flight = Chunk.objects.filter(job=job, queued_at__isnull=False).count()
    assert in_flight >= 1
    assert value(text, "anex_chunks_in_flight", model=MODEL) == in_flight
    assert value(text, "anex_chunks_waiting", model=MODEL) == 3 - in_flight
    assert value(text, "anex_jobs_unfinished", status="in_progress") == 1
    # then the queue depths are Redis's
    assert value(text, "anex_queue_depth", queue=queue) == before + in_flight
    assert value(text, "anex_queue_depth", queue=dispatch.ESTIMATE) >= 1
    assert value(text, "anex_metrics_source_up", source="broker") == 1
    # (nothing left for another test's worker to take)
    import dramatiq

    for name in (dispatch.ESTIMATE, queue):
        dramatiq.get_broker().flush(name)


def test_an_unreachable_broker_leaves_the_rest_of_the_scrape(settings: Settings) -> None:
    import dramatiq
    from dramatiq.brokers.redis import RedisBroker

    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    dead = RedisBroker(url="redis://127.0.0.1:1/0", namespace=broker.namespace)
    dramatiq.set_broker(dead)
    try:
        text = scrape()
    finally:
        dramatiq.set_broker(broker)
    assert value(text, "anex_metrics_source_up", source="broker") == 0
    assert value(text, "anex_metrics_source_up", source="database") == 1


def test_no_label_names_a_tenant(organization: Organization) -> None:
    # given a job that ran, and realtime and batch requests by a key
    job = job_run(organization, 5)
    key, secret = api_key_make(organization)
    auth = {"Authorization": f"Bearer {secret}"}
    Client().get(f"/batch/v1/jobs/{job.pk}", headers=auth)
    Client().post("/realtime/v1/embeddings", {"model": "all-minilm-l6-v2", "input": ["x"]},
                  content_type="application/json", headers=auth)
    Client().post("/realtime/v1/embeddings", {"model": f"made-up-{job.pk}", "input": ["x"]},
                  content_type="application/json", headers=auth)
    text = scrape()
    # then no label is a tenant's, and no id of theirs is anywhere in the text
    names = {name for sample in samples(text) for name in sample.labels}
    assert not names & TENANT_LABELS, names
    for ident in (organization.pk, key.pk, job.pk, secret, key.prefix):
        assert str(ident) not in text
    # the requests were counted by route pattern and the realtime ones by catalog model
    assert value(text, "django_http_requests_total", route="batch/v1/jobs/<str:job_id>",
                 method="GET", status="200") >= 1
    realtime = [s for s in samples(text) if s.name == "anex_realtime_requests_total"]
    # (the counters are the process's: a realtime test run before this one in the same
    # process may have counted other models' requests, and systemone's)
    models = {s.labels["model"] for s in realtime}
    assert models <= {*catalog_all(), "other", ""}, models
    assert "embeddings" in {s.labels["endpoint"] for s in realtime} <= {"embeddings",
                                                                       "systemone"}


def test_only_loopback_callers_read_it_without_a_token(settings: Settings) -> None:
    assert Client().get("/metrics").status_code == 200
    assert Client().get("/metrics", REMOTE_ADDR="10.1.2.3").status_code == 403
    assert Client().get("/metrics", REMOTE_ADDR="::1").status_code == 200
    # a proxy on this host forwarding someone else's request
    assert Client().get("/metrics", HTTP_X_FORWARDED_FOR="203.0.113.9").status_code == 403
    settings.ANEX_TRUSTED_PROXY_COUNT = 1
    assert Client().get("/metrics").status_code == 403


def test_with_a_token_only_its_bearer_reads_it(settings: Settings) -> None:
    settings.ANEX_METRICS_TOKEN = "s3cret-metrics-token"
    assert Client().get("/metrics").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer nope").status_code == 403
    response = Client().get("/metrics", REMOTE_ADDR="10.1.2.3",
                            HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert response.status_code == 200
    assert b"anex_jobs_total" in response.content


def exported_by_workers() -> set[str]:
    """The metric names a worker's port serves: Dramatiq's middleware's, the worker's own
    gauges, and vLLM's (read from their sources: a worker process is not started here)."""
    import re
    from importlib.util import find_spec

    import dramatiq.middleware.prometheus

    import anex.workermetrics

    names = set(re.findall(r'"(dramatiq_[a-z_]+)"',
                           Path(dramatiq.middleware.prometheus.__file__).read_text()))
    names |= set(re.findall(r'"(anex_worker_[a-z_]+)"',
                            Path(anex.workermetrics.__file__).read_text()))
    spec = find_spec("vllm")
    if spec is not None and spec.origin is not None:
        loggers = Path(spec.origin).parent / "v1" / "metrics" / "loggers.py"
        names |= set(re.findall(r'name="(vllm:[a-z_]+)"', loggers.read_text()))
    else:
        # Without vLLM installed, the names the dashboard reads (vllm 0.32's).
        names |= {"vllm:num_requests_running", "vllm:num_requests_waiting",
                  "vllm:kv_cache_usage_perc", "vllm:num_preemptions",
                  "vllm:generation_tokens", "vllm:prompt_tokens"}
    return {f"{name}{suffix}" for name in names
            for suffix in ("", "_total", "_bucket", "_sum", "_count")}


def test_every_dashboard_expression_reads_a_metric_that_is_exported(
        organization: Organization) -> None:
    import json
    import re

    # given every name the web tier serves (a job ran and requests were made, so every
    # labelled family has samples) and every name a worker serves
    job_run(organization, 2)
    Client().post("/realtime/v1/embeddings", {"model": "all-minilm-l6-v2", "input": ["x"]},
                  content_type="application/json")
    text = scrape()
    exported = {sample.name for sample in samples(text)} | exported_by_workers() | {
        f"{family.name}{suffix}" for family in text_string_to_metric_families(text)
        for suffix in ("", "_total")}
    # when the dashboard is read
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "anex.json").read_text())
    expressions = [target["expr"] for panel in dashboard["panels"]
                   for target in panel.get("targets", [])]
    assert len(expressions) >= 20
    # then each expression names at least one metric, and only exported ones
    for expr in expressions:
        named = set(re.findall(r"\b((?:anex|django|dramatiq)_[a-z_]+|vllm:[a-z_]+)", expr))
        assert named, expr
        assert named <= exported, (expr, named - exported)
