"""A worker's metrics port (anex/workermetrics.py) on a real `dramatiq anex.worker`:
Dramatiq's Prometheus metrics and the worker's own on /metrics, and /readyz 503 naming
the engine while a GPU worker's engine is not loaded, 200 once it is."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from anex.devstack import database_ensure
from jobs import dispatch
from tests.servers import free_port

ROOT = Path(__file__).resolve().parents[2]
EMBEDDER = "all-minilm-l6-v2"


def get(url: str) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:  # noqa: S310 - loopback
            return response.status, response.read()
    except urllib.error.HTTPError as error:
        return error.code, error.read()
    except OSError:
        return 0, b""


@contextmanager
def worker(tmp_path: Path, **env: str) -> Iterator[str]:
    # The environment's database, as `make run` makes it when missing (its tests use their
    # own): the worker's readiness asks it.
    database_ensure(os.environ["DATABASE_URL"])
    port = free_port()
    log = (tmp_path / f"worker-{port}.log").open("w")
    process = subprocess.Popen(
        [sys.executable, "-m", "dramatiq", "anex.worker", "--processes", "1",
         "--threads", "1"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT,
        env={**os.environ, "ANEX_WORKER_METRICS_PORT": str(port),
             "ANEX_WORKER_METRICS_DIR": str(tmp_path / f"metrics-{port}"), **env},
        start_new_session=True)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def readyz_until(base: str, status: int, timeout: float = 120) -> dict[str, object]:
    """GET /readyz until it answers `status` (the worker boots, its engine loads)."""
    deadline = time.monotonic() + timeout
    answered = (0, b"")
    while time.monotonic() < deadline:
        answered = get(f"{base}/readyz")
        if answered[0] == status:
            return dict(json.loads(answered[1]))
        time.sleep(0.5)
    raise AssertionError(f"/readyz never answered {status}: {answered!r}")


@pytest.mark.timeout(300)
def test_a_worker_serves_dramatiqs_metrics_and_is_ready(tmp_path: Path) -> None:
    with worker(tmp_path) as base:
        body = readyz_until(base, 200)
        assert body["checks"] == {"database": "ok", "broker": "ok", "storage": "ok",
                                  "workers": "ok", "breaker": "ok"}
        # when it runs a message (a webhook delivery that is not due: nothing to do)
        dispatch.send("delivery_attempt_task", str(uuid.uuid4()))
        deadline = time.monotonic() + 60
        counted = (b'dramatiq_messages_total{actor_name="delivery_attempt_task",'
                   b'queue_name="webhooks"} 1.0')
        # then Dramatiq's metrics count it, by queue and actor, beside the worker's own
        while counted not in (text := get(f"{base}/metrics")[1]):
            assert time.monotonic() < deadline, text
            time.sleep(0.3)
        assert b"dramatiq_message_duration_milliseconds_bucket{" in text
        assert b"anex_worker_processes 1.0" in text


@pytest.mark.timeout(300)
def test_a_gpu_worker_whose_engine_is_not_loaded_is_not_ready(tmp_path: Path) -> None:
    # given a worker that loads its engine at start, for a model it has no checkpoint of
    # (another model has one): its engine never loads
    with worker(tmp_path, ANEX_WORKER_PRELOAD="1", ANEX_WORKER_MODELS=EMBEDDER,
                ANEX_CHECKPOINTS=f"tiny-qwen3={tmp_path}") as base:
        body = readyz_until(base, 503)
        # then it is 503, naming the engine, while everything else answers
        deadline = time.monotonic() + 60
        while body["checks"].get("workers") != "ok":  # type: ignore[attr-defined]
            assert time.monotonic() < deadline, body
            body = readyz_until(base, 503)
        assert body["checks"] == {"database": "ok", "broker": "ok", "storage": "ok",
                                  "workers": "ok", "breaker": "ok",
                                  f"engine:{EMBEDDER}": "failed"}
        assert body["status"] == "unavailable"


@pytest.mark.timeout(600)
def test_a_gpu_worker_is_ready_once_its_engine_has_loaded(
        tmp_path: Path, checkpoint_dirs: dict[str, Path]) -> None:
    # (MiniLM's local checkpoint is the directory "minilm": a guessed path by the model's id
    # was never there, and this test skipped itself on every run)
    with worker(tmp_path, ANEX_WORKER_PRELOAD="1", ANEX_WORKER_MODELS=EMBEDDER,
                ANEX_CHECKPOINTS=f"{EMBEDDER}={checkpoint_dirs['minilm']}") as base:
        body = readyz_until(base, 200, timeout=500)
        assert body["checks"][f"engine:{EMBEDDER}"] == "ok"  # type: ignore[index]
        # and the engine's own vLLM metrics are relayed beside the worker's
        status, text = get(f"{base}/metrics")
        assert status == 200
        assert b'anex_worker_engine_loaded{model="all-minilm-l6-v2"} 1.0' in text
        assert b"vllm:" in text, text.decode()[-3000:]
