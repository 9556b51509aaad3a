"""GET /healthz reports database and broker reachability: 200, or 503 with Retry-After."""

from __future__ import annotations

import socket

import pytest
from django.db import OperationalError
from django.test import Client, override_settings

pytestmark = pytest.mark.django_db


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_healthy_with_both_reachable() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok", "database": "ok", "broker": "ok"}
    assert response["Cache-Control"] == "no-store"


def test_an_unreachable_broker_is_503() -> None:
    with override_settings(REDIS_URL=f"redis://127.0.0.1:{closed_port()}/0"):
        response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json() == {"status": "unavailable", "database": "ok", "broker": "unreachable"}
    assert int(response["Retry-After"]) >= 1


def test_an_unreachable_database_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr("anex.health.connection.cursor", refuse)
    response = Client().get("/healthz")
    assert response.status_code == 503
    assert response.json()["database"] == "unreachable"
