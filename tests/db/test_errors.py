"""One error envelope: {"detail": …} for every error the API answers."""

from __future__ import annotations

import pytest
from rest_framework.test import APIClient

from anex.api.errors import ApiError, error_response
from console.models import ApiKey
from tests.factories import api_key_make

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]


def test_an_unknown_api_path_is_a_json_404(api: APIClient) -> None:
    response = api.get("/batch/v1/no-such-endpoint")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("application/json")
    assert response.json() == {"detail": "Not found."}


def test_a_wrong_method_keeps_the_envelope(api: APIClient) -> None:
    response = api.delete("/batch/v1/_probe/body")
    assert response.status_code == 405
    assert set(response.json()) == {"detail"}


def test_a_missing_or_mistyped_body_field_is_422_naming_each_field(api: APIClient) -> None:
    response = api.post("/batch/v1/_probe/body", {"count": "many"}, format="json")
    assert response.status_code == 422
    body = response.json()
    assert "name: This field is required." in body["detail"]
    assert "count: A valid integer is required." in body["detail"]
    assert set(body["errors"]) == {"name", "count"}


def test_malformed_json_is_400(api: APIClient) -> None:
    response = api.generic("POST", "/batch/v1/_probe/body", "{not json",
                           content_type="application/json")
    assert response.status_code == 400
    assert response.json()["detail"].startswith("The request body is not valid JSON")


def test_a_valid_body_passes(api: APIClient) -> None:
    response = api.post("/batch/v1/_probe/body", {"name": "a", "count": 2}, format="json")
    assert (response.status_code, response.json()) == (200, {"name": "a", "count": 2})


def test_the_421_body_names_the_region_and_the_api_to_use(api: APIClient) -> None:
    response = api.get("/batch/v1/_probe/region/eu")
    assert response.status_code == 421
    assert response.json() == {
        "detail": "this job is stored in the EU region; use https://api-eu.anex.sh",
        "residency": "eu",
        "api": "https://api-eu.anex.sh",
    }


def test_world_data_asked_of_the_eu_host_is_421_naming_the_main_api(api: APIClient) -> None:
    response = api.get("/batch/v1/_probe/region/world", HTTP_HOST="api-eu.anex.sh")
    assert response.status_code == 421
    assert response.json()["api"] == "https://api.anex.sh"
    assert api.get("/batch/v1/_probe/region/eu", HTTP_HOST="api-eu.anex.sh").status_code == 200


def test_an_unexpected_error_is_a_json_500_without_internals(api: APIClient) -> None:
    response = api.get("/realtime/v1/_probe/crash")
    assert response.status_code == 500
    assert "boom" not in response.content.decode()
    assert set(response.json()) == {"detail"}


@pytest.mark.parametrize("status", [429, 503])
def test_429_and_503_always_carry_retry_after(status: int) -> None:
    response = error_response(ApiError(status, "wait"))
    assert int(response["Retry-After"]) >= 1
    assert error_response(ApiError(status, "wait", retry_after=42))["Retry-After"] == "42"


def test_the_request_rate_limit_is_429_with_its_code(client_for) -> None:  # type: ignore[no-untyped-def]
    key, plaintext = api_key_make(rate_limit_per_minute=2)
    client = client_for(plaintext)
    responses = [client.get(f"/batch/v1/_probe/keys/{key.pk}") for _ in range(3)]
    assert [r.status_code for r in responses] == [200, 200, 429]
    response = responses[2]
    assert 1 <= int(response["Retry-After"]) <= 60
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert "detail" in response.json()


def test_the_rate_limit_is_per_key(client_for, api_key: ApiKey) -> None:  # type: ignore[no-untyped-def]
    limited, limited_plaintext = api_key_make(api_key.organization, rate_limit_per_minute=1)
    _other, other_plaintext = api_key_make(api_key.organization, rate_limit_per_minute=1)
    path = f"/batch/v1/_probe/keys/{limited.pk}"
    assert client_for(limited_plaintext).get(path).status_code == 200
    assert client_for(limited_plaintext).get(path).status_code == 429
    assert client_for(other_plaintext).get(path).status_code == 200
