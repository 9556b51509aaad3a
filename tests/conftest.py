from __future__ import annotations

from collections.abc import Callable

import pytest
from rest_framework.test import APIClient

from console.models import ApiKey, Organization
from tests.factories import api_key_make, organization_make


@pytest.fixture
def organization(db: None) -> Organization:
    return organization_make()


@pytest.fixture
def key_pair(organization: Organization) -> tuple[ApiKey, str]:
    return api_key_make(organization)


@pytest.fixture
def api_key(key_pair: tuple[ApiKey, str]) -> ApiKey:
    return key_pair[0]


@pytest.fixture
def client_for() -> Callable[[str], APIClient]:
    def make(plaintext: str) -> APIClient:
        client = APIClient()
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        return client

    return make


@pytest.fixture
def api(key_pair: tuple[ApiKey, str], client_for: Callable[[str], APIClient]) -> APIClient:
    return client_for(key_pair[1])
