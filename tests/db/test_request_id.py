"""Every response carries a request id; a caller's valid X-Request-ID is echoed."""

from __future__ import annotations

import re

import pytest
from django.test import Client


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/healthz", "/batch/v1/nope", "/docs/", "/openapi.json"])
def test_every_response_carries_our_request_id(path: str) -> None:
    response = Client().get(path)
    assert re.fullmatch(r"req_[0-9a-f]{32}", response["X-Anex-Request-ID"])


@pytest.mark.django_db
def test_each_request_gets_its_own_id() -> None:
    client = Client()
    first, second = client.get("/healthz"), client.get("/healthz")
    assert first["X-Anex-Request-ID"] != second["X-Anex-Request-ID"]


@pytest.mark.django_db
@pytest.mark.parametrize("caller_id", ["abc-123", "7f3e0a0c-1111-2222-3333-444455556666",
                                       "trace:span.1_x"])
def test_a_valid_caller_request_id_is_echoed(caller_id: str) -> None:
    response = Client().get("/healthz", HTTP_X_REQUEST_ID=caller_id)
    assert response["X-Request-ID"] == caller_id
    assert response["X-Anex-Request-ID"] != caller_id


@pytest.mark.django_db
@pytest.mark.parametrize("caller_id", ["a" * 129, "has space", "<script>", "-leading-dash", ""])
def test_an_invalid_caller_request_id_is_not_reflected(caller_id: str) -> None:
    response = Client().get("/healthz", HTTP_X_REQUEST_ID=caller_id)
    assert "X-Request-ID" not in response
    assert response["X-Anex-Request-ID"].startswith("req_")
