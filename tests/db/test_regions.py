"""Data residency defaults and the 403 for EU without EU data routing."""

from __future__ import annotations

import pytest
from django.test import RequestFactory

from anex.errors import DomainError
from anex.regions import Region, region_origin, request_region, residency_resolve
from tests.factories import organization_make

pytestmark = pytest.mark.django_db


def test_an_omitted_residency_follows_the_organization() -> None:
    assert residency_resolve(organization=organization_make(), requested=None) == Region.WORLD
    eu_org = organization_make(eu_data_routing=True)
    assert residency_resolve(organization=eu_org, requested=None) == Region.EU
    assert residency_resolve(organization=eu_org, requested="world") == Region.WORLD


def test_eu_without_eu_routing_is_403_with_the_reference_message() -> None:
    with pytest.raises(DomainError) as error:
        residency_resolve(organization=organization_make(), requested="eu")
    assert error.value.status == 403
    assert error.value.body() == {
        "detail": "EU data routing is not enabled for this organization. Contact us to enable it."
    }


@pytest.mark.parametrize("host,region", [
    ("api.anex.sh", Region.WORLD), ("api-eu.anex.sh", Region.EU),
    ("API-EU.anex.sh:443", Region.EU), ("localhost", Region.WORLD),
])
def test_the_host_decides_the_region(host: str, region: Region) -> None:
    request = RequestFactory().get("/", HTTP_HOST=host)
    assert request_region(request) == region


def test_each_region_has_its_origin() -> None:
    assert region_origin(Region.EU) == "https://api-eu.anex.sh"
    assert region_origin(Region.WORLD) == "https://api.anex.sh"
