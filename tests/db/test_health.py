"""GET /healthz is liveness: 200 whenever the process answers, whatever its database or
broker (their outage is /readyz's 503, tests/db/test_readyz.py). Changed on purpose with
issue 24: it used to answer 503 when either was unreachable."""

from __future__ import annotations

import socket

import pytest
from django.db import OperationalError
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def readiness_unkept(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each probe here runs its checks (the answer kept between probes: test_readyz.py)."""
    monkeypatch.setattr("anex.health.READY_KEEP_SECONDS", 0)


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_alive_answers_200() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_an_unreachable_broker_leaves_liveness_200_and_readiness_503() -> None:
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0"):
        alive, ready = Client().get("/healthz"), Client().get("/readyz")
    assert alive.status_code == 200
    assert ready.status_code == 503
    assert ready.json()["checks"]["broker"] == "unreachable"


def test_an_unreachable_database_leaves_liveness_200_and_readiness_503(
        monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr("anex.health.connection.cursor", refuse)
    alive, ready = Client().get("/healthz"), Client().get("/readyz")
    assert alive.status_code == 200
    assert ready.status_code == 503
    assert ready.json()["checks"]["database"] == "unreachable"
