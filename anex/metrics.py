"""GET /metrics: the web tier's Prometheus exposition
(docs/dev/decisions/2026-12-02-fleet-figures-are-read-from-the-database-at-scrape-time.md).

Two sources:

- The fleet's figures, read from the database (and the queues' depths from Redis) at scrape
  time by FleetCollector: jobs ended by status, their rows by outcome and tokens by kind,
  the queue-wait and processing histograms, chunks in flight and waiting, jobs awaiting
  approval. Whichever worker did the work, every web process answers the same figures.
- This process's own requests, counted by RequestMetricsMiddleware: Django requests by
  route, method and status with their latency, and realtime requests by endpoint, model and
  status with theirs. Under gunicorn's several workers they are kept in prometheus_client's
  multiprocess mode (PROMETHEUS_MULTIPROC_DIR, an empty directory per start: `make run`
  sets one under the run directory) and a scrape adds every worker's up.

Answered to loopback callers only, or, when ANEX_METRICS_TOKEN is set, only to
`Authorization: Bearer <token>`. No label names an organization, a key or a job: what a
tenant did belongs in the logs (tests/db/test_metrics.py holds every label to that).
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.db.models import Count
from django.http import HttpRequest, HttpResponse
from django.utils import timezone
from django.views.decorators.http import require_GET
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    REGISTRY,
    CollectorRegistry,
    Histogram,
    generate_latest,
)
from prometheus_client import Counter as CounterMetric
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from inference.catalog import model_get
from inference.pricing import USAGE_RENAMED, Usage
from jobs.constants import TERMINAL_STATUSES, JobStatus, Priority
from jobs.models import Chunk, Job
from jobs.selectors import queue_depths
from jobs.services.chunks import IN_FLIGHT, WAITING

logger = logging.getLogger(__name__)

# Jobs take seconds to days: buckets up to a week (Dramatiq's own stop at 15 minutes).
JOB_SECONDS_BUCKETS: tuple[float, ...] = (
    10, 30, 60, 300, 900, 1800, 3600, 2 * 3600, 6 * 3600, 12 * 3600, 86400, 2 * 86400,
    4 * 86400, 7 * 86400)
# A job's size class (anex_job_processing_seconds{size}): its rows, at most this many.
SIZE_CLASSES: tuple[tuple[int, str], ...] = (
    (100, "le100"), (1000, "le1k"), (10_000, "le10k"), (100_000, "le100k"))
SIZE_OVER = "over100k"
# Realtime and Django request latencies: milliseconds to the realtime timeout and past it.
REQUEST_SECONDS_BUCKETS: tuple[float, ...] = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
# What a job ending writes is committed well inside this: the jobs that ended earlier are
# added up once per process and kept, only the later ones are read at every scrape.
SETTLED_AFTER = timedelta(minutes=10)
# The recovery pass's words for a job whose estimate waited past its approval window
# (jobs.services.recovery._expire): cancelled unapproved, counted as expired.
EXPIRED_REASON = "The estimate was not approved within 24 hours."
EXPIRED = "expired"
ROW_OUTCOMES = ("success", "error", "format_error", "truncated")
# The kind label of each Usage field (media_seconds is a duration, not counted here).
TOKEN_KINDS = {"input_tokens": "prompt", "media_tokens": "media", "output_tokens": "completion",
               "media_row_tokens": "media_row", "images": "image", "clips": "clip"}
KNOWN_METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
# The realtime routes (realtime/urls.py) and the endpoint each is.
REALTIME_ROUTES = {"realtime-embeddings": "embeddings", "realtime-systemone": "systemone"}


# --- this process's requests ------------------------------------------------------------

HTTP_REQUESTS = CounterMetric(
    "django_http_requests", "Django requests answered, by route pattern, method and status.",
    ["route", "method", "status"])
HTTP_SECONDS = Histogram(
    "django_http_request_duration_seconds", "Django request latency, by route pattern.",
    ["route", "method"], buckets=REQUEST_SECONDS_BUCKETS)
REALTIME_REQUESTS = CounterMetric(
    "anex_realtime_requests", "Realtime requests answered, by endpoint, model and status.",
    ["endpoint", "model", "status"])
REALTIME_SECONDS = Histogram(
    "anex_realtime_request_duration_seconds", "Realtime request latency.",
    ["endpoint", "model"], buckets=REQUEST_SECONDS_BUCKETS)


class RequestMetricsMiddleware:
    """Counts every request and its latency by its route's pattern (never its path, which
    carries ids), and the realtime ones by endpoint and model as well."""

    def __init__(self, get_response: Callable[[HttpRequest], HttpResponse]) -> None:
        self.get_response = get_response

    def __call__(self, request: HttpRequest) -> HttpResponse:
        started = time.perf_counter()
        response = self.get_response(request)
        seconds = time.perf_counter() - started
        match = request.resolver_match
        route = str(match.route) if match is not None else "unmatched"
        method = request.method if request.method in KNOWN_METHODS else "other"
        status = str(response.status_code)
        HTTP_REQUESTS.labels(route, method, status).inc()
        HTTP_SECONDS.labels(route, method).observe(seconds)
        endpoint = REALTIME_ROUTES.get(match.url_name or "") if match is not None else None
        if endpoint is not None:
            model = _requested_model(response)
            REALTIME_REQUESTS.labels(endpoint, model, status).inc()
            REALTIME_SECONDS.labels(endpoint, model).observe(seconds)
        return response


def _requested_model(response: HttpResponse) -> str:
    """The catalog model a realtime request named, as its view read it ("other" for a name
    not in the catalog, "" when the body was not read): a label takes a bounded set of
    values, never what a caller makes up."""
    context = getattr(response, "renderer_context", None) or {}
    data = getattr(context.get("request"), "_full_data", None)
    model = data.get("model") if isinstance(data, dict) else None
    if not isinstance(model, str):
        return ""
    return model if model_get(model) is not None else "other"


# --- the fleet, from the database -------------------------------------------------------


@dataclass
class Buckets:
    """A histogram's observations: per bucket (not cumulative, the last one +Inf) and
    their sum; two add up."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(JOB_SECONDS_BUCKETS) + 1))
    total: float = 0.0

    def __add__(self, other: Buckets) -> Buckets:
        return Buckets([a + b for a, b in zip(self.counts, other.counts, strict=True)],
                       self.total + other.total)

    def cumulative(self) -> list[tuple[str, float]]:
        running = 0
        out: list[tuple[str, float]] = []
        for bound, count in zip((*JOB_SECONDS_BUCKETS, float("inf")), self.counts,
                                strict=True):
            running += count
            out.append((floatToGoString(bound), running))
        return out


@dataclass
class Ended:
    """What the jobs that ended in a stretch of time add to the counters."""

    jobs: Counter[str] = field(default_factory=Counter)
    rows: Counter[tuple[str, str]] = field(default_factory=Counter)
    tokens: Counter[tuple[str, str]] = field(default_factory=Counter)
    wait: Buckets = field(default_factory=Buckets)
    processing: dict[str, Buckets] = field(default_factory=dict)
    # By urgency tier: each chunk's wait from its job's approval to its start.
    chunk_wait: dict[str, Buckets] = field(default_factory=dict)

    def __add__(self, other: Ended) -> Ended:
        return Ended(
            self.jobs + other.jobs, self.rows + other.rows, self.tokens + other.tokens,
            self.wait + other.wait, _by_label(self.processing, other.processing),
            _by_label(self.chunk_wait, other.chunk_wait))


def _by_label(one: dict[str, Buckets], two: dict[str, Buckets]) -> dict[str, Buckets]:
    return {label: one.get(label, Buckets()) + two.get(label, Buckets())
            for label in {*one, *two}}


def _bucket_sql(seconds: str) -> str:
    """The index of the bucket (le) that `seconds` falls in: how many bounds are below it."""
    return f"(SELECT count(*) FROM unnest(%s::float8[]) AS bound WHERE bound < {seconds})"  # noqa: S608


def ended_figures(*, after: datetime | None, upto: datetime | None) -> Ended:
    """The counters' share of the jobs that ended after `after`, up to `upto` (either open),
    summed in the database: a few grouped rows come back, however many jobs ended."""
    where = ["j.status = ANY(%s)", "j.finished_at IS NOT NULL"]
    params: list[Any] = [sorted(TERMINAL_STATUSES)]
    if after is not None:
        where.append("j.finished_at > %s")
        params.append(after)
    if upto is not None:
        where.append("j.finished_at <= %s")
        params.append(upto)
    window = " AND ".join(where)
    job_table, chunk_table = Job._meta.db_table, Chunk._meta.db_table
    bounds = list(JOB_SECONDS_BUCKETS)
    size = "CASE " + " ".join(f"WHEN coalesce(j.row_count, 0) <= {limit} THEN '{name}'"
                              for limit, name in SIZE_CLASSES) + f" ELSE '{SIZE_OVER}' END"
    first_started = (f"(SELECT min(c.started_at) FROM {chunk_table} c "  # noqa: S608
                     "WHERE c.job_id = j.id)")
    processing = "extract(epoch FROM j.finished_at - j.approved_at)"
    usage_names = [f.name for f in Usage.__dataclass_fields__.values()
                   if f.name in TOKEN_KINDS] + list(USAGE_RENAMED)
    # The SQL's text is this module's own (table and column names, bounds, size classes);
    # every value from outside is a parameter.
    figures = Ended()
    with connection.cursor() as cursor:
        cursor.execute(
            f"SELECT j.status, (j.status = %s AND j.approved_at IS NULL "  # noqa: S608
            f"AND j.failure_reason = %s), j.model, count(*), "
            f"coalesce(sum(j.success_rows), 0), coalesce(sum(j.error_rows), 0), "
            f"coalesce(sum(j.format_error_rows), 0), coalesce(sum(j.truncated_rows), 0) "
            f"FROM {job_table} j WHERE {window} GROUP BY 1, 2, 3",
            [JobStatus.CANCELLED.value, EXPIRED_REASON, *params])
        for status, expired, model, jobs, *rows in cursor.fetchall():
            figures.jobs[EXPIRED if expired else status] += jobs
            for outcome, count in zip(ROW_OUTCOMES, rows, strict=True):
                figures.rows[(model, outcome)] += count
        cursor.execute(
            f"SELECT {size}, {_bucket_sql(processing)}, count(*), sum({processing}) "  # noqa: S608
            f"FROM {job_table} j WHERE {window} AND j.approved_at IS NOT NULL GROUP BY 1, 2",
            [bounds, *params])
        for size_class, bucket, count, seconds in cursor.fetchall():
            buckets = figures.processing.setdefault(size_class, Buckets())
            buckets.counts[bucket] += count
            buckets.total += float(seconds or 0)
        wait = "extract(epoch FROM started - approved_at)"
        cursor.execute(
            f"SELECT {_bucket_sql(wait)}, count(*), sum({wait}) FROM ("  # noqa: S608
            f"SELECT j.approved_at, {first_started} AS started FROM {job_table} j "
            f"WHERE {window} AND j.approved_at IS NOT NULL) AS ran "
            f"WHERE started IS NOT NULL GROUP BY 1", [bounds, *params])
        for bucket, count, seconds in cursor.fetchall():
            figures.wait.counts[bucket] += count
            figures.wait.total += float(seconds or 0)
        # Each chunk's queue wait, by its job's urgency tier: from the approval (when its
        # chunks may first be sent) to the chunk's start (docs/dev/decisions/
        # 2026-12-06-urgency-tiers.md).
        chunk_wait = "extract(epoch FROM c.started_at - j.approved_at)"
        cursor.execute(
            f"SELECT j.priority, {_bucket_sql(chunk_wait)}, count(*), "  # noqa: S608
            f"sum({chunk_wait}) FROM {job_table} j JOIN {chunk_table} c ON c.job_id = j.id "
            f"WHERE {window} AND j.approved_at IS NOT NULL AND c.started_at IS NOT NULL "
            f"GROUP BY 1, 2", [bounds, *params])
        for tier, bucket, count, seconds in cursor.fetchall():
            buckets = figures.chunk_wait.setdefault(tier, Buckets())
            buckets.counts[bucket] += count
            buckets.total += float(seconds or 0)
        sums = ", ".join(f"coalesce(sum((c.usage ->> '{name}')::bigint), 0)"
                         for name in usage_names)
        cursor.execute(
            f"SELECT j.model, {sums} FROM {job_table} j JOIN {chunk_table} c "  # noqa: S608
            f"ON c.job_id = j.id WHERE {window} GROUP BY 1", params)
        for model, *amounts in cursor.fetchall():
            for name, amount in zip(usage_names, amounts, strict=True):
                kind = TOKEN_KINDS[USAGE_RENAMED.get(name, name)]
                figures.tokens[(model, kind)] += int(amount)
    return figures


class EndedTotals:
    """The counters over every job that ever ended: the part older than SETTLED_AFTER is
    added up once per process and then only extended, the rest read at each scrape."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._through: datetime | None = None
        self._settled = Ended()

    def read(self) -> Ended:
        horizon = timezone.now() - SETTLED_AFTER
        with self._lock:
            if self._through is None or horizon > self._through:
                self._settled = self._settled + ended_figures(after=self._through,
                                                              upto=horizon)
                self._through = horizon
            settled, through = self._settled, self._through
        return settled + ended_figures(after=through, upto=None)

    def reset(self) -> None:
        """Forget what was added up (tests, whose database starts empty each time)."""
        with self._lock:
            self._through, self._settled = None, Ended()


ENDED = EndedTotals()


def _by(values: Iterable[tuple[str, int]]) -> dict[str, int]:
    return {str(key): int(count) for key, count in values}


class FleetCollector(Collector):
    """The fleet's figures, read when Prometheus scrapes."""

    def collect(self) -> Iterator[Metric]:
        up = GaugeMetricFamily("anex_metrics_source_up",
                               "Whether the scrape could read this source.", labels=["source"])
        try:
            yield from self._database()
            up.add_metric(["database"], 1)
        except DatabaseError as exc:
            logger.warning("metrics: database unreadable: %s", exc.__class__.__name__)
            up.add_metric(["database"], 0)
        try:
            yield from self._queues()
            up.add_metric(["broker"], 1)
        except redis.RedisError as exc:
            logger.warning("metrics: broker unreadable: %s", exc.__class__.__name__)
            up.add_metric(["broker"], 0)
        yield up

    def _database(self) -> Iterator[Metric]:
        ended = ENDED.read()
        jobs = CounterMetricFamily("anex_jobs", "Jobs ended, by terminal status (expired: "
                                   "cancelled unapproved at the end of its window).",
                                   labels=["status"])
        for status in (*sorted(TERMINAL_STATUSES), EXPIRED):
            jobs.add_metric([status], ended.jobs[status])
        yield jobs
        rows = CounterMetricFamily("anex_rows", "Rows of ended jobs, by model and outcome.",
                                   labels=["model", "outcome"])
        for (model, outcome), count in sorted(ended.rows.items()):
            rows.add_metric([model, outcome], count)
        yield rows
        tokens = CounterMetricFamily("anex_tokens", "Tokens (and media items) that ended "
                                     "jobs' rows billed, by model and kind.",
                                     labels=["model", "kind"])
        for (model, kind), amount in sorted(ended.tokens.items()):
            tokens.add_metric([model, kind], amount)
        yield tokens
        wait = HistogramMetricFamily("anex_job_queue_wait_seconds", "Ended jobs: from "
                                     "approval to their first chunk running.")
        wait.add_metric([], ended.wait.cumulative(), ended.wait.total)
        yield wait
        processing = HistogramMetricFamily("anex_job_processing_seconds", "Ended jobs: "
                                           "from approval to the end, by rows.",
                                           labels=["size"])
        for size in [name for _limit, name in SIZE_CLASSES] + [SIZE_OVER]:
            buckets = ended.processing.get(size, Buckets())
            processing.add_metric([size], buckets.cumulative(), buckets.total)
        yield processing
        chunk_wait = HistogramMetricFamily(
            "anex_chunk_queue_wait_seconds", "Ended jobs' chunks: from the job's approval to "
            "the chunk's start, by urgency tier (flex, standard, priority).", labels=["tier"])
        for tier in Priority.values:
            buckets = ended.chunk_wait.get(tier, Buckets())
            chunk_wait.add_metric([tier], buckets.cumulative(), buckets.total)
        yield chunk_wait
        for name, where, doc in (
                ("anex_chunks_in_flight", IN_FLIGHT, "Chunks sent to a worker or running."),
                ("anex_chunks_waiting", WAITING, "Chunks waiting for room to be sent.")):
            gauge = GaugeMetricFamily(name, doc, labels=["model"])
            for model, count in _by(Chunk.objects.filter(where).values_list("job__model")
                                    .annotate(n=Count("pk")).order_by()).items():
                gauge.add_metric([model], count)
            yield gauge
        unfinished = _by(Job.objects.exclude(status__in=TERMINAL_STATUSES)
                         .values_list("status").annotate(n=Count("pk")).order_by())
        by_status = GaugeMetricFamily("anex_jobs_unfinished", "Jobs not ended, by status.",
                                      labels=["status"])
        for status in JobStatus.values:
            if status not in TERMINAL_STATUSES:
                by_status.add_metric([status], unfinished.get(status, 0))
        yield by_status
        yield GaugeMetricFamily("anex_jobs_awaiting_approval",
                                "Jobs with an estimate waiting for approval.",
                                value=unfinished.get(JobStatus.COST_READY, 0))

    def _queues(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily("anex_queue_depth", "Messages waiting in a Dramatiq queue.",
                                  labels=["queue"])
        delayed = GaugeMetricFamily("anex_queue_delayed", "Messages delayed on a queue "
                                    "(a backoff or a deferral).", labels=["queue"])
        depths = queue_depths()
        if depths is None:
            raise redis.RedisError("the broker did not answer")
        for queue in depths:
            depth.add_metric([queue.name], queue.ready)
            delayed.add_metric([queue.name], queue.delayed)
        yield depth
        yield delayed


class _ThisProcess(Collector):
    """This process's own metrics when not in multiprocess mode (one web process)."""

    def collect(self) -> Iterator[Metric]:
        yield from REGISTRY.collect()


def exposition() -> bytes:
    """The text a scrape gets: every web process's requests and the fleet's figures."""
    registry = CollectorRegistry(auto_describe=False)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
        MultiProcessCollector(registry)
    else:
        registry.register(_ThisProcess())
    registry.register(FleetCollector())
    return generate_latest(registry)


def scrape_allowed(request: HttpRequest) -> bool:
    """With ANEX_METRICS_TOKEN set, only a request bearing it; else only a loopback caller
    that no proxy forwarded (behind a proxy every caller looks like the proxy: set a token)."""
    token = settings.ANEX_METRICS_TOKEN
    if token:
        given = request.headers.get("Authorization", "")
        return hmac.compare_digest(given.encode(), f"Bearer {token}".encode())
    if settings.ANEX_TRUSTED_PROXY_COUNT or "X-Forwarded-For" in request.headers \
            or "Forwarded" in request.headers:
        return False
    try:
        return ipaddress.ip_address(request.META.get("REMOTE_ADDR", "")).is_loopback
    except ValueError:
        return False


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    if not scrape_allowed(request):
        return HttpResponse("Forbidden.\n", status=403, content_type="text/plain")
    response = HttpResponse(exposition(), content_type=CONTENT_TYPE_LATEST)
    response["Cache-Control"] = "no-store"
    return response
