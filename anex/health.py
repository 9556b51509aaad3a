"""GET /healthz: liveness, the process answers and nothing else (a database or broker
outage must not get a healthy web process restarted). GET /readyz: is this process ready
for traffic: its database, its broker, its storage and, where it fronts realtime engines
(ANEX_REALTIME_ENGINES), each engine answering (an engine server answers once its engine has
loaded). A worker answers /readyz on its own
metrics port (anex/workermetrics.py) from the same checks."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

from anex.metrics import scrape_allowed
from anex.redis import fail_fast
from anex.regions import Region
from jobs.storage import storage_for

logger = logging.getLogger(__name__)
CHECK_TIMEOUT_SECONDS = 2


def database_reachable() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError as exc:
        logger.warning("healthz: database unreachable: %s", exc.__class__.__name__)
        return False


def broker_reachable() -> bool:
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=CHECK_TIMEOUT_SECONDS,
        socket_timeout=CHECK_TIMEOUT_SECONDS,
        retry=fail_fast(),
    )
    try:
        return bool(client.ping())
    except redis.RedisError as exc:
        logger.warning("healthz: broker unreachable: %s", exc.__class__.__name__)
        return False
    finally:
        client.close()


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    response = JsonResponse({"status": "ok"})
    response["Cache-Control"] = "no-store"
    return response


OK = "ok"
UNREACHABLE = "unreachable"
# A key that is never written: asking whether it exists is a round trip to the storage.
STORAGE_PROBE_KEY = "readyz/probe"
# Storage and engines are asked in parallel and given this long in all (an S3 client's
# own retries could take a minute).
_pool = ThreadPoolExecutor(max_workers=8, thread_name_prefix="readyz")


def storage_reachable() -> bool:
    try:
        for region in Region.values:
            storage_for(region).exists(STORAGE_PROBE_KEY)
    except Exception as exc:  # botocore's, the filesystem's: any failure is not ready
        logger.warning("readyz: storage unreachable: %s", exc.__class__.__name__)
        return False
    return True


def engine_answers(model_id: str, url: str) -> bool:
    """The realtime engine server at `url` answers GET /health serving `model_id` (it
    listens while its engine loads, and answers only once it has loaded)."""
    try:
        with urllib.request.urlopen(f"{url}/health",  # noqa: S310 - configured URL
                                    timeout=CHECK_TIMEOUT_SECONDS) as response:
            served = json.loads(response.read()).get("models", {})
    except (OSError, ValueError, AttributeError):
        return False
    return model_id in served


def realtime_engines_ready() -> dict[str, Callable[[], bool]]:
    """One check per realtime model this process fronts: any of its engines answers."""
    return {f"realtime:{model_id}": (lambda m=model_id, u=urls: any(  # type: ignore[misc]
                engine_answers(m, url) for url in u))
            for model_id, urls in settings.ANEX_REALTIME_ENGINES.items()}


def checks_run(checks: dict[str, Callable[[], bool]]) -> dict[str, str]:
    """Run the checks side by side, each "ok" or "unreachable" (one that has not answered
    in time included)."""
    futures = {name: _pool.submit(check) for name, check in checks.items()}
    states = {}
    for name, future in futures.items():
        try:
            states[name] = OK if future.result(timeout=CHECK_TIMEOUT_SECONDS + 1) else \
                UNREACHABLE
        except FutureTimeout:
            states[name] = UNREACHABLE
    return states


def readiness(extra: dict[str, Callable[[], bool]] | None = None) -> dict[str, str]:
    """The checks of this process: database and broker here (the database connection is
    this thread's), the storage, the realtime engines and `extra` side by side."""
    checks = {"database": OK if database_reachable() else UNREACHABLE,
              "broker": OK if broker_reachable() else UNREACHABLE}
    checks.update(checks_run({"storage": storage_reachable, **realtime_engines_ready(),
                              **(extra or {})}))
    return checks


# A probe's answer is kept this long per process: a flood of probes (anyone may ask)
# costs PostgreSQL, Redis, the storage and the engines one round of checks a process per
# period, never one per request (issue 40 L4). Well under any orchestrator's probe period.
READY_KEEP_SECONDS = 1.5


class Kept:
    """`compute`'s answer, kept for READY_KEEP_SECONDS: the first caller after that computes
    it again while the others wait for it and share it, so at most one round of checks runs
    at a time in the process."""

    def __init__(self, compute: Callable[[], dict[str, str]]) -> None:
        self._compute = compute
        self._lock = threading.Lock()
        self._answer: tuple[float, dict[str, str]] | None = None

    def get(self) -> dict[str, str]:
        with self._lock:
            if self._answer is None or time.monotonic() - self._answer[0] >= READY_KEEP_SECONDS:
                checks = self._compute()
                self._answer = (time.monotonic(), checks)
            return dict(self._answer[1])

    def forget(self) -> None:
        """For tests that change what the checks reach."""
        with self._lock:
            self._answer = None


kept_readiness = Kept(readiness)


def readiness_response(checks: dict[str, str], *, detailed: bool) -> JsonResponse:
    """200 or 503 with the status; the checks by name only to `detailed` callers (which of
    the database, the broker, the storage or an engine is down is for the operator)."""
    ready = all(state == OK for state in checks.values())
    body: dict[str, object] = {"status": "ready" if ready else "unavailable"}
    if detailed:
        body["checks"] = checks
    response = JsonResponse(body, status=200 if ready else 503)
    if not ready:
        response["Retry-After"] = str(settings.ANEX_RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    # The details go where /metrics goes: a loopback caller no proxy forwarded (an
    # orchestrator's probe inside the container), or the bearer of ANEX_METRICS_TOKEN.
    return readiness_response(kept_readiness.get(), detailed=scrape_allowed(request))
