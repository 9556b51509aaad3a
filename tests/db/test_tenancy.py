"""Another organization's id answers 404 exactly like an unknown one, everywhere."""

from __future__ import annotations

import uuid

import pytest
from rest_framework.test import APIClient

from anex.errors import DomainError
from console.models import ApiKey, Organization
from console.selectors import api_key_get
from tests.factories import api_key_make, organization_make

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]


def test_the_selector_finds_its_own_organizations_object(organization: Organization,
                                                          api_key: ApiKey) -> None:
    assert api_key_get(organization=organization, id=api_key.pk) == api_key
    assert api_key_get(organization=organization, id=str(api_key.pk)) == api_key


@pytest.mark.parametrize("make_id", [
    lambda: str(api_key_make()[0].pk),  # another organization's
    lambda: str(uuid.uuid4()),  # nobody's
    lambda: "not-a-uuid",  # not even an id
])
def test_the_selector_raises_the_same_404_for_every_foreign_id(organization: Organization,
                                                                make_id) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(DomainError) as error:
        api_key_get(organization=organization, id=make_id())
    assert (error.value.status, error.value.body()) == (404, {"detail": "API key not found"})


def test_over_http_other_organizations_ids_are_indistinguishable_from_unknown_ones(
        api: APIClient) -> None:
    other_org = organization_make()
    other_key, _ = api_key_make(other_org)
    foreign = api.get(f"/batch/v1/_probe/keys/{other_key.pk}")
    unknown = api.get(f"/batch/v1/_probe/keys/{uuid.uuid4()}")
    assert foreign.status_code == unknown.status_code == 404
    assert foreign.json() == unknown.json() == {"detail": "API key not found"}


def test_scoped_querysets_only_see_their_organization(organization: Organization) -> None:
    mine, _ = api_key_make(organization)
    api_key_make()
    assert list(ApiKey.objects.for_org(organization)) == [mine]
