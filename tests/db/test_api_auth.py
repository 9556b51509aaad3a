"""Authentication: Bearer or x-api-key; missing is 422, invalid/revoked/expired is 401."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest
from django.db import OperationalError
from django.utils import timezone
from rest_framework.test import APIClient

from console.models import ApiKey, AuditEvent
from console.services import api_key_revoke
from tests.factories import SYSTEM, api_key_make

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]
INVALID = {"detail": "The API key is invalid or no longer active."}


def probe(client: APIClient, key: ApiKey):  # type: ignore[no-untyped-def]
    return client.get(f"/batch/v1/_probe/keys/{key.pk}")


def test_a_bearer_key_is_accepted(api: APIClient, api_key: ApiKey) -> None:
    response = probe(api, api_key)
    assert response.status_code == 200
    assert response.json()["caller"] == str(api_key.pk)


def test_an_x_api_key_header_is_accepted(key_pair: tuple[ApiKey, str]) -> None:
    key, plaintext = key_pair
    response = probe(APIClient(HTTP_X_API_KEY=plaintext), key)
    assert response.status_code == 200


def test_the_bearer_scheme_is_case_insensitive(key_pair: tuple[ApiKey, str]) -> None:
    key, plaintext = key_pair
    response = APIClient(HTTP_AUTHORIZATION=f"bearer {plaintext}").get(
        f"/batch/v1/_probe/keys/{key.pk}")
    assert response.status_code == 200


def test_a_missing_header_is_422(api_key: ApiKey) -> None:
    response = probe(APIClient(), api_key)
    assert response.status_code == 422
    assert "Authorization: Bearer" in response.json()["detail"]
    assert set(response.json()) == {"detail"}


@pytest.mark.parametrize("header", [
    "Bearer sk-nope", "Bearer ", "Basic dXNlcjpwYXNz", "Token sk-abcdefghijkl_" + "a" * 40,
])
def test_an_invalid_key_is_401(api_key: ApiKey, header: str) -> None:
    response = probe(APIClient(HTTP_AUTHORIZATION=header), api_key)
    assert response.status_code == 401
    assert response.json() == INVALID


def test_a_revoked_key_is_401(key_pair: tuple[ApiKey, str],
                              client_for: Callable[[str], APIClient]) -> None:
    key, plaintext = key_pair
    api_key_revoke(key=key, actor=SYSTEM)
    response = probe(client_for(plaintext), key)
    assert response.status_code == 401
    assert response.json() == INVALID


def test_an_expired_key_is_401(client_for: Callable[[str], APIClient]) -> None:
    key, plaintext = api_key_make(expires_at=timezone.now() - timedelta(minutes=1))
    assert probe(client_for(plaintext), key).status_code == 401


def test_a_key_that_cannot_be_checked_is_503_with_retry_after(
        key_pair: tuple[ApiKey, str], client_for: Callable[[str], APIClient],
        monkeypatch: pytest.MonkeyPatch) -> None:
    key, plaintext = key_pair

    def database_down(raw: str) -> None:
        raise OperationalError("connection refused")

    monkeypatch.setattr("anex.api.authentication.api_key_for_plaintext", database_down)
    response = probe(client_for(plaintext), key)
    assert response.status_code == 503
    assert int(response["Retry-After"]) > 0
    assert "could not be validated" in response.json()["detail"]


def test_using_a_key_records_its_last_use(api: APIClient, api_key: ApiKey) -> None:
    assert api_key.last_used_at is None
    probe(api, api_key)
    api_key.refresh_from_db()
    assert api_key.last_used_at is not None


def test_every_key_action_names_its_actor(api_key: ApiKey) -> None:
    event = AuditEvent.objects.get(action="api_key.created", target_id=str(api_key.pk))
    assert event.actor_label == "system: tests"
    assert event.organization_id == api_key.organization_id
