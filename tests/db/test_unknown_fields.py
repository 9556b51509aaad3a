"""Issue 40: a body field the endpoint does not take was dropped without a word, so
`"max_ouput_tokens": 5` (a typo) ran the job with the default cap, priced accordingly.
Every JSON endpoint of the batch and realtime APIs - each operation /openapi.json gives a
JSON body - refuses one, 422 naming it, and its schema says it takes no other
(anex.api.serializers.Closed). The OpenAI SDK's own requests still pass."""

from __future__ import annotations

import base64
import json
import struct
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from rest_framework.test import APIClient

from console.models import Organization
from jobs.models import Job
from tests.factories import chat_request_line, input_ready

pytestmark = pytest.mark.django_db
TYPO = "max_ouput_tokens"
UNKNOWN = "not_a_field_here"
APIS = ("/batch/", "/realtime/")


def json_operations() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(method, path, request body schema) of each batch and realtime operation that takes
    a JSON body, its path's ids filled in."""
    document = APIClient().get("/openapi.json").json()
    schemas = document["components"]["schemas"]
    for template, item in document["paths"].items():
        if not template.startswith(APIS):
            continue
        for method, operation in item.items():
            content = operation.get("requestBody", {}).get("content", {})
            if "application/json" not in content:
                continue
            path = template
            for parameter in operation.get("parameters", []):
                if parameter["in"] == "path":
                    path = path.replace("{" + parameter["name"] + "}", str(uuid.uuid4()))
            ref = content["application/json"]["schema"]["$ref"]
            yield method, path, schemas[ref.removeprefix("#/components/schemas/")]


def test_every_json_endpoint_refuses_an_unknown_field_naming_it(api: APIClient) -> None:
    operations = list(json_operations())
    assert {path.removeprefix("/").split("/")[2] for _m, path, _s in operations} >= {
        "inputs", "jobs", "checks", "embeddings", "systemone"}
    for method, path, schema in operations:
        # the document says so
        assert schema.get("additionalProperties") is False, path
        # and the endpoint answers so, whatever else the body holds
        response = getattr(api, method)(path, {UNKNOWN: 5}, format="json")
        assert response.status_code == 422, (method, path, response.content)
        answer = response.json()
        assert answer["errors"][UNKNOWN] == ["Unrecognized request argument supplied."], path
        assert f"{UNKNOWN}: Unrecognized request argument supplied." in answer["detail"], path


def test_a_misspelt_max_output_tokens_is_refused_and_no_job_is_made(
        api: APIClient, organization: Organization) -> None:
    item = input_ready(organization, chat_request_line("r1"))
    body = {"input_id": str(item.pk), "model": "gemma4-12b"}
    response = api.post("/batch/v1/jobs", {**body, TYPO: 5}, format="json")
    assert (response.status_code, response.json()) == (422, {
        "detail": f"{TYPO}: Unrecognized request argument supplied; did you mean "
                  "max_output_tokens?",
        "errors": {TYPO: ["Unrecognized request argument supplied; did you mean "
                          "max_output_tokens?"]}})
    assert not Job.objects.exists()
    # every problem of the body at once: a wrongly typed field beside the unknown one
    both = api.post("/batch/v1/jobs", {**body, "reasoning": "yes", "colour": 1}, format="json")
    assert both.status_code == 422
    assert set(both.json()["errors"]) == {"reasoning", "colour"}
    # spelt right, it is taken
    assert api.post("/batch/v1/jobs", {**body, "max_output_tokens": 5},
                    format="json").status_code == 200


def test_a_realtime_decision_names_an_unknown_field_before_its_model_is_looked_up(
        api: APIClient) -> None:
    # No engine serves laya here (a 501): the body's shape is answered first, as an
    # embedding request's is.
    response = api.post("/realtime/v1/systemone", {
        "model": "laya", "state": "x", "questions": {"q": {"type": "noul",
                                                           "instructions": "?"}},
        "temperature": 0}, format="json")
    assert (response.status_code, response.json()["errors"]) == (
        422, {"temperature": ["Unrecognized request argument supplied."]})


def test_the_openai_sdks_default_embedding_request_has_no_field_refused(
        api: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # What the official client sends for client.embeddings.create(...) with every argument
    # it has, read off the request it builds (no network): each is a field of the body.
    import httpx
    import openai

    sent: list[dict[str, Any]] = []

    def transport(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        vector: Any = base64.b64encode(struct.pack("<f", 1.0)).decode() \
            if body.get("encoding_format") == "base64" else [1.0]
        return httpx.Response(200, json={
            "object": "list", "model": "m",
            "data": [{"object": "embedding", "index": 0, "embedding": vector}],
            "usage": {"prompt_tokens": 1, "total_tokens": 1}})

    client = openai.OpenAI(base_url="http://anex.test/realtime/v1", api_key="sk-x",
                           # the SDK's own httpx, under the name its stubs give it
                           http_client=httpx.Client(  # type: ignore[arg-type]
                               transport=httpx.MockTransport(transport)))
    client.embeddings.create(model="m", input="x")
    client.embeddings.create(model="m", input=["x"], dimensions=64, encoding_format="float",
                             user="u")
    assert sent and all(field in ("model", "input", "dimensions", "encoding_format", "user")
                        for body in sent for field in body)
    for body in sent:
        response = api.post("/realtime/v1/embeddings", body, format="json")
        assert "Unrecognized" not in response.content.decode(), body
