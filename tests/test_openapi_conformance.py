"""/openapi.json says exactly what the API does, and what Schemathesis found on the way is
answered as the reference says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient


@pytest.mark.django_db
@pytest.mark.parametrize("body,name", [
    ({"source_url": "https://[", "format": "jsonl"}, "source_url"),
    ({"source_url": "https://files.example.com/a.jsonl", "callback_url": "https://[::1"},
     "callback_url"),
])
def test_a_url_whose_host_cannot_be_read_is_the_references_400(
        api: APIClient, body: dict[str, Any], name: str) -> None:
    # urlsplit raises on an unbalanced or invalid [IPv6] host: that was a 500.
    response = api.post("/batch/v1/inputs", body, format="json")
    assert (response.status_code, response.json()) == (
        400, {"detail": f"{name} must be an https:// URL."})


@pytest.mark.django_db
def test_either_key_header_is_enough() -> None:
    document = APIClient().get("/openapi.json").json()
    requirements = {json_key(op.get("security")) for item in document["paths"].values()
                    for op in item.values()}
    assert requirements == {json_key([{"bearerAuth": []}, {"apiKeyHeader": []}])}


def json_key(value: Any) -> str:
    return json.dumps(value, sort_keys=True)
