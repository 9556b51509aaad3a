"""GET /readyz (anex/health.py): 200 only while the database, the broker, the storage and
every realtime engine this process fronts answer; else 503 naming the check that does not
(to a loopback caller or the metrics token's bearer: others read the status alone). An
answer is kept 1.5 s per process, so a flood of probes is one round of checks.
/healthz stays the liveness probe."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from django.test import Client
from pytest_django import Settings

from anex import health
from inference.catalog import model_get
from inference.kinds import kind_for
from realtime.serving import Batcher, EngineServer, Served

pytestmark = pytest.mark.django_db
MODEL = "all-minilm-l6-v2"


@pytest.fixture(autouse=True)
def readiness_unkept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each probe runs its checks, but in the tests of the answer kept between probes."""
    monkeypatch.setattr("anex.health.READY_KEEP_SECONDS", 0)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def loading_engine() -> Iterator[str]:
    """An engine server still loading its engine: `make run` binds and listens on its port
    before the server builds the engine, and nothing answers until it has."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        yield f"http://127.0.0.1:{listening.getsockname()[1]}"


@pytest.fixture
def loaded_engine() -> Iterator[str]:
    """A realtime engine server answering GET /health for MODEL (its engine a stand-in:
    /health reads only what it serves)."""
    model = model_get(MODEL)
    assert model is not None
    kind = kind_for(model)
    served = {MODEL: Served(model_id=MODEL, kind=kind,
                            batcher=Batcher(MODEL, lambda rows: rows, 1), load_seconds=0.5)}
    server = EngineServer(("127.0.0.1", 0), served, secret="s" * 32)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                              daemon=True)
    thread.start()
    try:
        yield server.url
    finally:
        server.shutdown()
        server.server_close()


def readyz() -> tuple[int, dict[str, object]]:
    response = Client().get("/readyz")
    assert response["Cache-Control"] == "no-store"
    return response.status_code, response.json()


def test_ready_with_everything_answering() -> None:
    status, body = readyz()
    assert status == 200, body
    assert body == {"status": "ready",
                    "checks": {"database": "ok", "broker": "ok", "storage": "ok"}}


def test_the_broker_stopped_is_503_naming_it(settings: Settings) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{closed_port()}/0"
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "checks": {
        "database": "ok", "broker": "unreachable", "storage": "ok"}}
    assert int(response["Retry-After"]) >= 1
    # and the liveness probe is not readiness: the process answers, so it is alive
    alive = Client().get("/healthz")
    assert (alive.status_code, alive.json()) == (200, {"status": "ok"})


def test_an_engine_still_loading_is_503_naming_it(
        settings: Settings, monkeypatch: pytest.MonkeyPatch, loading_engine: str,
        loaded_engine: str) -> None:
    monkeypatch.setattr("anex.health.CHECK_TIMEOUT_SECONDS", 0.3)
    settings.ANEX_REALTIME_ENGINES = {MODEL: (loading_engine,)}
    status, body = readyz()
    assert status == 503
    assert body["checks"] == {"database": "ok", "broker": "ok", "storage": "ok",
                              f"realtime:{MODEL}": "unreachable"}
    # once the engine has loaded and answers, ready
    settings.ANEX_REALTIME_ENGINES = {MODEL: (loaded_engine,)}
    status, body = readyz()
    assert status == 200, body
    assert body["checks"][f"realtime:{MODEL}"] == "ok"  # type: ignore[index]


def test_an_engine_not_started_or_serving_another_model_is_not_ready(
        settings: Settings, loaded_engine: str) -> None:
    settings.ANEX_REALTIME_ENGINES = {
        MODEL: (f"http://127.0.0.1:{closed_port()}",),
        "systemone-decide": (loaded_engine,)}
    status, body = readyz()
    assert status == 503
    assert body["checks"][f"realtime:{MODEL}"] == "unreachable"  # type: ignore[index]
    assert body["checks"]["realtime:systemone-decide"] == "unreachable"  # type: ignore[index]
    # one of a model's engines answering is enough
    settings.ANEX_REALTIME_ENGINES = {
        MODEL: (f"http://127.0.0.1:{closed_port()}", loaded_engine)}
    assert readyz()[0] == 200


def test_unreachable_storage_is_503_naming_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: object, key: str) -> bool:
        raise ConnectionError("no route to the bucket")

    monkeypatch.setattr("jobs.storage.LocalRegionStorage.exists", refuse)
    status, body = readyz()
    assert status == 503
    assert body["checks"]["storage"] == "unreachable"  # type: ignore[index]


def test_a_flood_of_probes_runs_one_round_of_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    # given the answer kept as deployed, and checks that count their rounds (each takes a
    # while, as a database under load does)
    monkeypatch.setattr("anex.health.READY_KEEP_SECONDS", 1.5)
    health.kept_readiness.forget()
    rounds = []

    def counted() -> bool:
        rounds.append(1)
        time.sleep(0.2)
        return True

    monkeypatch.setattr("anex.health.database_reachable", counted)
    monkeypatch.setattr("anex.health.broker_reachable", counted)
    monkeypatch.setattr("anex.health.storage_reachable", counted)
    # when 40 probes arrive at once
    with ThreadPoolExecutor(max_workers=40) as pool:
        answers = list(pool.map(lambda _: health.kept_readiness.get(), range(40)))
    # then the database, the broker and the storage were each asked once, not 40 times
    assert len(rounds) == 3
    assert all(answer == {"database": "ok", "broker": "ok", "storage": "ok"}
               for answer in answers)
    # and a probe after the period asks again
    monkeypatch.setattr("anex.health.READY_KEEP_SECONDS", 0)
    health.kept_readiness.get()
    assert len(rounds) == 6


def test_the_checks_are_named_only_to_loopback_or_the_token(settings: Settings) -> None:
    # an outside caller (through the proxy, or straight) reads the status alone
    outside = Client().get("/readyz", REMOTE_ADDR="203.0.113.9")
    assert (outside.status_code, outside.json()) == (200, {"status": "ready"})
    forwarded = Client().get("/readyz", HTTP_X_FORWARDED_FOR="203.0.113.9")
    assert forwarded.json() == {"status": "ready"}
    # the container's own probe on loopback reads the checks
    assert "checks" in Client().get("/readyz").json()
    # and with a token set, its bearer does, from anywhere
    settings.ANEX_METRICS_TOKEN = "s3cret-metrics-token"
    assert Client().get("/readyz").json() == {"status": "ready"}
    bearer = Client().get("/readyz", REMOTE_ADDR="203.0.113.9",
                          HTTP_AUTHORIZATION="Bearer s3cret-metrics-token")
    assert bearer.json()["checks"]["database"] == "ok"
