"""OpenAPI 3.1 at /openapi.json (and YAML), and the batch API's own at /batch/v1/."""

from __future__ import annotations

import pytest
import yaml
from django.test import Client

pytestmark = pytest.mark.django_db
HTTP_METHODS = {"get", "post", "put", "patch", "delete", "head", "options"}


def operations(document: dict) -> list[dict]:  # type: ignore[type-arg]
    return [operation for item in document["paths"].values()
            for method, operation in item.items() if method in HTTP_METHODS]


@pytest.mark.parametrize("path", ["/openapi.json", "/batch/v1/openapi.json"])
def test_the_document_is_openapi_3_1_with_both_key_headers(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 200
    document = response.json()
    assert document["openapi"].startswith("3.1")
    assert document["info"]["title"]
    assert {server["url"] for server in document["servers"]} == {
        "https://api.anex.sh", "https://api-eu.anex.sh"}


@pytest.mark.urls("tests.urls")
def test_every_operation_has_a_unique_id_and_documents_the_key_schemes() -> None:
    # tests.urls adds probe endpoints built like the product's, so this has operations to see.
    document = Client().get("/openapi.json").json()
    found = operations(document)
    assert found, "no operations in the document"
    ids = [operation.get("operationId") for operation in found]
    assert all(ids) and len(ids) == len(set(ids))
    schemes = document["components"]["securitySchemes"]
    assert schemes["bearerAuth"] == {
        "type": "http", "scheme": "bearer",
        "description": "An API key from the console's Keys page: sk-…"}
    assert schemes["apiKeyHeader"]["in"] == "header"
    assert schemes["apiKeyHeader"]["name"] == "x-api-key"


@pytest.mark.parametrize("path", ["/openapi.yaml", "/batch/v1/openapi.yaml"])
def test_the_yaml_is_the_same_document(path: str) -> None:
    response = Client().get(path)
    assert response.status_code == 200
    json_path = path.replace(".yaml", ".json")
    assert yaml.safe_load(response.content) == Client().get(json_path).json()


def test_the_schema_needs_no_key() -> None:
    assert Client().get("/openapi.json").status_code == 200
