"""/openapi.json says exactly what the API does, and what Schemathesis found on the way is
answered as the reference says."""

from __future__ import annotations

import json
from typing import Any

import pytest
from rest_framework.test import APIClient

from console.models import Organization
from tests.factories import chat_request_line, input_ready


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


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/batch/v1/jobs", "/batch/v1/checks"])
@pytest.mark.parametrize("response_format", [
    {"type": "json_schema", "json_schema": {"schema": {"title": "a\x00b"}}},
    {"type": "json_object", "\x00": True},
])
def test_a_response_format_holding_a_nul_is_422_like_any_other_field(
        api: APIClient, organization: Organization, path: str,
        response_format: dict[str, Any]) -> None:
    # PostgreSQL's jsonb stores no NUL: the submit (and the check) of a ready input
    # answered 500 once the job's row was written.
    item = input_ready(organization, chat_request_line("r1"))
    response = api.post(path, {"input_id": str(item.pk), "model": "gemma4-12b",
                               "response_format": response_format}, format="json")
    assert (response.status_code, response.json()["errors"]) == (
        422, {"response_format": ["Null characters are not allowed."]})


@pytest.mark.django_db
def test_each_create_links_to_the_operations_that_take_its_id() -> None:
    document = APIClient().get("/openapi.json").json()
    by_id = {op["operationId"]: op for item in document["paths"].values()
             for op in item.values()}
    found = {(operation_id, status, name, str(link["parameters"]))
             for operation_id, op in by_id.items()
             for status, answer in op["responses"].items()
             for name, link in answer.get("links", {}).items()}
    job = ("getJob", "getJobProgress", "getJobResult", "approveJob", "cancelJob", "rerunJob",
           "deleteJobData")
    assert found == {
        ("createInput", "200", "getInput", "{'input_id': '$response.body#/id'}"),
        ("createCheck", "202", "getCheck", "{'check_id': '$response.body#/id'}"),
        *{(create, "200", read, "{'job_id': '$response.body#/id'}")
          for create in ("submitJob", "rerunJob") for read in job}}
    assert all(by_id[link[2]] for link in found)  # every link names a real operation
