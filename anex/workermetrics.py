"""A worker's own port (ANEX_WORKER_METRICS_PORT): GET /metrics and GET /readyz.

    ANEX_WORKER_METRICS_PORT=9191 dramatiq anex.worker

/metrics is Dramatiq's Prometheus middleware (messages by queue and actor, errors, retries,
durations) with the engines' own vLLM metrics beside it (waiting and running requests, KV
cache usage, preemptions, prompt and generation tokens: vLLM records them in-process once
stat logging is on, ANEX_ENGINE_METRICS) and this module's worker gauges. Every worker
process writes them into one prometheus_client multiprocess directory; one forked process
(Dramatiq's `forks`) serves them all, as Dramatiq's own exposition server does.

/readyz answers 200 or 503 with {"status", "checks"}: the database, the broker, the
storage, at least one worker process booted, and, for a worker that loads its engines at
start (ANEX_WORKER_PRELOAD=1, a GPU worker), "engine:<model>" for each model it serves,
ready once every worker process has built it ("loading" until then, "failed" when a
build failed: its log says why). Other checks a worker process publishes
(WORKER_PROCESS_CHECKS) are listed too.

The directory is ANEX_WORKER_METRICS_DIR (empty at each start: `make run` makes one under
its run directory); a worker role started without one gets a fresh private one
(metrics_dir_make: mkdtemp, so no other local user can guess its name and plant files or a
link there before the worker writes into it), and a bare `dramatiq anex.worker` with a port
must name one. The host is ANEX_WORKER_METRICS_HOST (default 127.0.0.1; 0.0.0.0 for a
scraper on another machine, which the settings refuse without ANEX_METRICS_TOKEN), and with
ANEX_METRICS_TOKEN set both paths want it as a bearer token.
"""

from __future__ import annotations

import functools
import hmac
import logging
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import dramatiq

logger = logging.getLogger(__name__)

DIR_PREFIX = "anex-worker-metrics-"
DEFAULT_HOST = "127.0.0.1"
# Checks a worker process evaluates and publishes (True: fine), each shown on /readyz as
# "<name>": anex/worker.py adds "breaker", False while a model's breaker is open
# (jobs.failures.worker_engine_state).
WORKER_PROCESS_CHECKS: dict[str, Callable[[], bool]] = {}
CHECK_EVERY_SECONDS = 5.0


def metrics_port() -> int | None:
    raw = os.environ.get("ANEX_WORKER_METRICS_PORT", "").strip()
    return int(raw) if raw else None


def metrics_dir() -> Path:
    """Where every process of this worker keeps its metrics: the same answer in the
    Dramatiq master's worker processes and in its forked server (both its children), read
    from the environment they inherit."""
    configured = os.environ.get("ANEX_WORKER_METRICS_DIR", "").strip()
    if not configured:
        # The processes cannot agree on a fresh name among themselves, and a name made from
        # the master's pid is one another local user can create first.
        from django.core.exceptions import ImproperlyConfigured

        raise ImproperlyConfigured(
            "ANEX_WORKER_METRICS_PORT needs ANEX_WORKER_METRICS_DIR: start the worker as its "
            "role (python -m anex.roles worker-gpu or worker-cpu), which makes a private "
            "one, or name an empty directory of its own.")
    return Path(configured)


def metrics_dir_make() -> None:
    """In a worker role about to become its Dramatiq master (anex.roles, before exec): with
    a metrics port and no directory named, a new private one (mode 0700, an unguessable
    name) for every process it starts. Its name keeps the master's pid (this process's: exec
    keeps it) for _stale_dirs_remove."""
    if metrics_port() is None or os.environ.get("ANEX_WORKER_METRICS_DIR", "").strip():
        return
    os.environ["ANEX_WORKER_METRICS_DIR"] = tempfile.mkdtemp(
        prefix=f"{DIR_PREFIX}{os.getpid()}-")


def preloading() -> bool:
    return os.environ.get("ANEX_WORKER_PRELOAD", "").strip().lower() in ("1", "true", "yes")


def worker_metrics_configure() -> bool:
    """In a worker process, before Django and anything that imports prometheus_client:
    metrics into the shared directory, Dramatiq's middleware configured (it reads its
    environment once, on import), vLLM's stat logging on. False when no port is set."""
    port = metrics_port()
    if port is None:
        return False
    directory = metrics_dir()
    directory.mkdir(parents=True, exist_ok=True)
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(directory)
    os.environ["dramatiq_prom_db"] = str(directory)
    os.environ["dramatiq_prom_port"] = str(port)
    os.environ["dramatiq_prom_host"] = os.environ.get("ANEX_WORKER_METRICS_HOST",
                                                      DEFAULT_HOST)
    os.environ.setdefault("ANEX_ENGINE_METRICS", "1")
    return True


def worker_metrics_install(broker: dramatiq.Broker) -> None:
    """Add the middleware (after worker_metrics_configure and Django's setup)."""
    from dramatiq.middleware.prometheus import Prometheus
    from prometheus_client import Gauge

    class WorkerMetrics(Prometheus):  # type: ignore[misc]
        """Dramatiq's middleware, its exposition server replaced by serve() (the same
        metrics, and /readyz), and the worker's own gauges."""

        @property
        def forks(self) -> list[Callable[[], int]]:
            return [serve]

        def after_worker_boot(self, broker: dramatiq.Broker, worker: Any) -> None:
            Gauge("anex_worker_processes", "Worker processes booted.",
                  multiprocess_mode="livesum", registry=None).set(1)
            checks = Gauge("anex_worker_check", "A worker process's own check (1: fine).",
                           ["check"], multiprocess_mode="livemin", registry=None)
            engines = Gauge("anex_worker_engine_loaded", "Whether every worker process has "
                            "built the model's engine.", ["model"],
                            multiprocess_mode="livemin", registry=None)
            if preloading():
                from django.conf import settings

                for model_id in settings.ANEX_WORKER_MODELS:
                    engines.labels(model_id).set(0)
                threading.Thread(target=_engines_build, args=(engines,), daemon=True,
                                 name="engine-preload").start()
            if WORKER_PROCESS_CHECKS:
                threading.Thread(target=_checks_publish, args=(checks,), daemon=True,
                                 name="worker-checks").start()

    broker.add_middleware(WorkerMetrics())


def _engines_build(engines: Any) -> None:
    """Build every served model's engine now rather than at its first chunk, so the worker
    reports ready only once it can run one at once."""
    from django.conf import settings

    from inference.kinds import engine_for

    for model_id in settings.ANEX_WORKER_MODELS:
        try:
            engine_for(model_id)
        except Exception:  # the engine's fault: the worker stays unready, and says why
            logger.exception("the engine for %s could not be built", model_id)
            engines.labels(model_id).set(-1)
            continue
        engines.labels(model_id).set(1)


def _checks_publish(checks: Any) -> None:
    while True:
        for name, check in list(WORKER_PROCESS_CHECKS.items()):
            try:
                fine = bool(check())
            except Exception:  # a check that fails says not ready
                logger.exception("worker check %s failed", name)
                fine = False
            checks.labels(name).set(1 if fine else 0)
        time.sleep(CHECK_EVERY_SECONDS)


# --- the forked server ------------------------------------------------------------------


def _collected() -> Any:
    from prometheus_client import CollectorRegistry
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry(auto_describe=False)
    MultiProcessCollector(registry, path=str(metrics_dir()))
    return registry


def worker_readiness() -> dict[str, str]:
    """The worker's checks, read from what its processes published."""
    from django.conf import settings
    from django.db import connections

    from anex.health import (
        OK,
        UNREACHABLE,
        broker_reachable,
        checks_run,
        database_reachable,
        storage_reachable,
    )

    booted = 0.0
    engines: dict[str, float] = {}
    published: dict[str, str] = {}
    for metric in _collected().collect():
        for sample in metric.samples:
            if sample.name == "anex_worker_processes":
                booted += sample.value
            elif sample.name == "anex_worker_engine_loaded":
                engines[sample.labels["model"]] = sample.value
            elif sample.name == "anex_worker_check":
                published[sample.labels["check"]] = OK if sample.value == 1 else "failing"
    try:
        checks = {"database": OK if database_reachable() else UNREACHABLE,
                  "broker": OK if broker_reachable() else UNREACHABLE,
                  **checks_run({"storage": storage_reachable}),
                  "workers": OK if booted >= 1 else "starting"}
    finally:
        connections.close_all()
    if preloading():
        for model_id in settings.ANEX_WORKER_MODELS:
            loaded = engines.get(model_id, 0)
            checks[f"engine:{model_id}"] = OK if loaded == 1 else "failed" if loaded < 0 \
                else "loading"
    checks.update(published)
    return checks


@functools.cache
def _worker_readiness_kept() -> Any:
    from anex.health import Kept

    return Kept(worker_readiness)


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        from django.conf import settings
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        token = settings.ANEX_METRICS_TOKEN
        if token and not hmac.compare_digest(
                self.headers.get("Authorization", "").encode(), f"Bearer {token}".encode()):
            self._answer(403, "text/plain", b"Forbidden.\n")
        elif self.path == "/metrics":
            self._answer(200, CONTENT_TYPE_LATEST, generate_latest(_collected()))
        elif self.path == "/readyz":
            import json

            checks = _worker_readiness_kept().get()  # a flood of probes: one round a period
            ready = all(state == "ok" for state in checks.values())
            body = {"status": "ready" if ready else "unavailable", "checks": checks}
            self._answer(200 if ready else 503, "application/json",
                         json.dumps(body).encode())
        else:
            self._answer(404, "text/plain", b"Not found.\n")

    def _answer(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        logger.debug(format, *args)


def _stale_dirs_remove() -> None:
    """The directories metrics_dir_make made for Dramatiq masters that are gone (none when
    this worker's directory was named by its operator)."""
    ours = metrics_dir()
    temporary = Path(tempfile.gettempdir())
    if ours.parent != temporary or not ours.name.startswith(DIR_PREFIX):
        return
    for path in temporary.glob(f"{DIR_PREFIX}*"):
        pid = path.name.removeprefix(DIR_PREFIX).partition("-")[0]
        if path != ours and pid.isdigit() and path.owner() == ours.owner() \
                and not _alive(int(pid)):
            shutil.rmtree(path, ignore_errors=True)


def _alive(pid: int) -> bool:
    # anex.devstack's pid_alive, which imports anex.roles: the roles import this module.
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def serve() -> int:
    """The forked process (Dramatiq's `forks`): serves the worker's port until stopped."""
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "anex.settings")
    django.setup()
    _stale_dirs_remove()
    from django.conf import settings

    port = metrics_port() or 0
    host = settings.ANEX_WORKER_METRICS_HOST  # loopback, or the token is set (settings)
    server = ThreadingHTTPServer((host, port), _Handler)
    server.daemon_threads = True
    logger.info("worker metrics and readiness on http://%s:%s", host, port)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()
    return 0
