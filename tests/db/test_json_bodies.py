"""Issue 40: what a JSON body may become once parsed is bounded per endpoint, before it is
parsed (M3), and a body nested past any real request's depth is the caller's 400, never a
RecursionError's 500 - on every JSON endpoint of every surface (anex/api/bodylimit.py,
anex/api/parsers.py)."""

from __future__ import annotations

import io
import json
import tracemalloc
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from django.test.client import RequestFactory
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.api.bodylimit import REALTIME_EMBEDDINGS_PATH, body_limit
from anex.api.errors import ApiError
from anex.api.parsers import JSON_MAX_DEPTH, BoundedJSONParser, too_deep_detail
from console.models import Organization
from inference.catalog import model_get
from inference.kinds.embed import REALTIME_MAX_INPUTS, REALTIME_MAX_TOTAL_CHARS
from inference.response_format import MAX_BYTES as RESPONSE_FORMAT_MAX_BYTES
from jobs.models import Job
from tests.db.test_console import form, signed_in
from tests.factories import chat_request_line, input_ready
from tests.servers import LocalServer, reply

pytestmark = pytest.mark.django_db
EMBED, DECIDE, MINILM = "/realtime/v1/embeddings", "/realtime/v1/systemone", "all-minilm-l6-v2"
EMOJI = "\U0001f600"  # 12 bytes in JSON's escapes (a surrogate pair): the costliest character


@pytest.fixture
def engine(settings: Settings, server: LocalServer) -> LocalServer:
    """A realtime engine server for MiniLM and laya, answering whatever it is sent."""
    def embeddings(handler: Any) -> None:
        sent = json.loads(handler.server.owner.requests[-1].body)
        reply(handler, body=json.dumps({"data": [
            {"embedding": [1.0] + [0.0] * 383, "prompt_tokens": 5}
            for _ in sent["input"]]}).encode())

    def decisions(handler: Any) -> None:
        sent = json.loads(handler.server.owner.requests[-1].body)
        reply(handler, body=json.dumps({
            "answers": {name: {"type": "choice", "choice": "a", "confidence": 0.5,
                               "answer_confidence": 0.5} for name in sent["questions"]},
            "input_tokens": 9, "routing": {"model": "english", "reason": "-"}}).encode())

    server.routes["/v1/embeddings"], server.routes["/v1/systemone"] = embeddings, decisions
    settings.ANEX_REALTIME_ENGINES = {MINILM: server.url(""), "laya": server.url("")}
    return server


def detail_of(response: Any) -> str:
    """The error's words in either envelope (the OpenAI surface's, or {"detail": ...})."""
    body = response.json()
    return str(body["error"]["message"] if "error" in body else body["detail"])


# -- M3: each endpoint's items, counted before anything is parsed --------------------------

def test_a_26_mib_embedding_request_of_empty_objects_is_refused_before_it_is_parsed(
        api: APIClient, monkeypatch: pytest.MonkeyPatch) -> None:
    # given the review's body: 26 MiB, under the endpoint's byte cap, of nine million {}
    size = body_limit(EMBED).bytes - 64
    body = ('{"model": "all-minilm-l6-v2", "input": ['
            + "{}," * (size // 3 - 20) + "{}]}").encode()
    assert len(body) <= size
    parsed: list[int] = []
    real_loads = json.loads

    def loads(text: str | bytes, *args: Any, **kwargs: Any) -> Any:
        parsed.append(len(text))
        return real_loads(text, *args, **kwargs)

    monkeypatch.setattr(json, "loads", loads)
    # when it is sent (from a stream over the body: the test client copies nothing)
    environ: dict[str, Any] = {"CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
    tracemalloc.start()
    try:
        response = api.post(EMBED, content_type="application/json", **environ)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # then it is refused for its count, never handed to the JSON parser, and the request
    # held its bytes and its text, not nine million objects (about 650 MB once parsed)
    assert response.status_code == 413, response.content
    assert response.json() == {"detail": (
        f"The request body holds more than {body_limit(EMBED).items:,} JSON values and "
        "keys, over the limit of this endpoint. Send a smaller request.")}
    assert all(length < 1024 * 1024 for length in parsed)
    assert peak < 3 * len(body), f"peak {peak:,} bytes for a {len(body):,}-byte body"


# Every JSON endpoint, with the body that reaches its parser (a path id: any uuid).
JSON_ENDPOINTS = ["/batch/v1/inputs", "/batch/v1/jobs", "/batch/v1/checks",
                  "/batch/v1/jobs/5b0c5bd8-30fa-4b8b-a3b1-7d9f3bb0a0a1/rerun", EMBED, DECIDE,
                  "/openai/v1/batches"]


@pytest.mark.parametrize("path", JSON_ENDPOINTS)
def test_each_endpoint_parses_up_to_its_items_and_refuses_one_more(
        api: APIClient, path: str) -> None:
    items = body_limit(path).items

    def body(count: int) -> str:  # {"input": [...]}: the body, a key, a list, its zeros
        return '{"input": [' + ",".join(["0"] * (count - 3)) + "]}"

    at_limit = api.post(path, body(items), content_type="application/json")
    assert at_limit.status_code not in (413, 500), at_limit.content
    assert "JSON values and keys" not in detail_of(at_limit)
    over = api.post(path, body(items + 1), content_type="application/json")
    assert over.status_code == 413, over.content
    assert f"holds more than {items:,} JSON values and keys" in detail_of(over)


def test_the_largest_valid_realtime_requests_are_answered(
        api: APIClient, engine: LocalServer) -> None:
    # 128 inputs of 2,097,152 characters in all, each 12 bytes as the SDK escapes them
    # (json.dumps' default): 25 MB, answered as the reference says (it was a 500 past
    # Django's 2.5 MiB DATA_UPLOAD_MAX_MEMORY_SIZE, DRF reading request.body)
    per_input = REALTIME_MAX_TOTAL_CHARS // REALTIME_MAX_INPUTS
    embeddings = json.dumps({"model": MINILM, "input": [EMOJI * per_input] * REALTIME_MAX_INPUTS,
                             "dimensions": 384, "encoding_format": "float", "user": "u"})
    assert len(embeddings) > 25_000_000
    answered = api.post(EMBED, embeddings, content_type="application/json")
    assert answered.status_code == 200, answered.content[:300]
    assert len(answered.json()["data"]) == REALTIME_MAX_INPUTS
    # a state object of 50,000 characters of the most items, and 64 questions of as many
    # options as the option budget can give a token each
    laya = model_get("laya")
    assert laya is not None and laya.max_state_chars and laya.max_questions
    state = {"body": [0] * ((laya.max_state_chars - 12) // 2)}
    assert len(json.dumps(state, separators=(",", ":"))) <= laya.max_state_chars
    questions = {f"q{n}": {"type": "choice", "instructions": "Which?",
                           "criteria": {f"o{i}": "" for i in range(192)}}
                 for n in range(laya.max_questions)}
    decided = api.post(DECIDE, json.dumps({"model": "laya", "state": state,
                                           "questions": questions, "lang": "en"}, indent=2),
                       content_type="application/json")
    assert decided.status_code == 200, decided.content[:300]
    assert len(decided.json()["answers"]) == laya.max_questions


def test_the_largest_valid_bodies_of_the_batch_and_openai_apis_are_read(
        api: APIClient, organization: Organization) -> None:
    # a submit's response_format of 64 KiB as compact JSON, the most items it can hold and
    # non-ASCII text, sent indented and escaped as a client may write it
    spare = RESPONSE_FORMAT_MAX_BYTES - 200
    schema = {"type": "object", "description": EMOJI * (spare // 16),
              "examples": [0] * (spare * 3 // 8)}
    response_format = {"type": "json_schema", "json_schema": {"name": "big", "schema": schema}}
    compact = json.dumps(response_format, ensure_ascii=False, separators=(",", ":"))
    assert RESPONSE_FORMAT_MAX_BYTES - 300 < len(compact.encode()) <= RESPONSE_FORMAT_MAX_BYTES
    item = input_ready(organization, chat_request_line("r1"))
    submitted = api.post("/batch/v1/jobs", json.dumps(
        {"input_id": str(item.pk), "model": "gemma4-12b", "response_format": response_format},
        indent=4), content_type="application/json")
    assert submitted.status_code == 200, submitted.content[:300]
    assert Job.objects.for_org(organization).get().response_format == response_format
    # an input's longest URLs, escaped: read, then refused by the reference's own rule
    escaped = "".join(f"\\u{ord(ch):04x}" for ch in "http://files.example.com/")
    url = '"' + escaped + "\\u0061" * (8192 - 25) + '"'
    refused = api.post("/batch/v1/inputs", '{"source_url": ' + url + ', "format": "jsonl"}',
                       content_type="application/json")
    assert (refused.status_code, detail_of(refused)) == (400, "source_url must be an https:// URL.")
    # an OpenAI batch's 16 metadata pairs at their longest, escaped
    metadata = {f"{n:02d}" + EMOJI * 62: EMOJI * 512 for n in range(16)}
    batch = api.post("/openai/v1/batches", json.dumps({
        "input_file_id": "file-nothing", "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": metadata}), content_type="application/json")
    assert (batch.status_code, detail_of(batch)) == (404, "No such File object: file-nothing")


def test_a_body_sent_without_a_length_is_read_no_further_than_its_limit() -> None:
    # Django reads no body without a Content-Length; were one handed to the parser (a
    # server passing a chunked body on), it stops one read past the endpoint's limit.
    class Endless(io.RawIOBase):
        read_bytes = 0

        def read(self, size: int = -1) -> bytes:
            self.read_bytes += size
            return b" " * size

    stream = Endless()
    request = RequestFactory().post(REALTIME_EMBEDDINGS_PATH)
    with pytest.raises(ApiError) as refused:
        BoundedJSONParser().parse(stream, "application/json", {"request": request})
    assert refused.value.status == 413
    assert stream.read_bytes <= body_limit(REALTIME_EMBEDDINGS_PATH).bytes + 64 * 1024


# -- a body nested thousands of levels deep ------------------------------------------------

def nested(levels: int) -> str:
    """{"model": [[...]]}: `levels` arrays and objects deep, the body itself one of them."""
    return '{"model": ' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


def json_operations() -> Iterator[tuple[str, str]]:
    """Every operation of /openapi.json that takes a JSON body, its path's ids filled in."""
    document = APIClient().get("/openapi.json").json()
    for template, item in document["paths"].items():
        for method, operation in item.items():
            if "application/json" in operation.get("requestBody", {}).get("content", {}):
                path = template
                for parameter in operation.get("parameters", []):
                    if parameter["in"] == "path":
                        path = path.replace("{" + parameter["name"] + "}", str(uuid.uuid4()))
                yield method, path


def test_every_json_endpoint_answers_a_body_5000_levels_deep_400(api: APIClient) -> None:
    operations = list(json_operations())
    surfaces = {path.split("/")[1] for _method, path in operations}
    assert surfaces == {"batch", "realtime", "openai"}
    for method, path in operations:
        response = getattr(api, method)(path, nested(5000), content_type="application/json")
        assert response.status_code == 400, (method, path, response.content)
        assert detail_of(response) == too_deep_detail("The request body", JSON_MAX_DEPTH)
        if path.startswith("/openai/"):
            assert response.json()["error"]["type"] == "invalid_request_error"
        # at the limit it is read, and answered for what it holds
        deepest = getattr(api, method)(path, nested(JSON_MAX_DEPTH),
                                       content_type="application/json")
        assert deepest.status_code < 500, (method, path, deepest.content)
        assert "nests JSON" not in detail_of(deepest)


def test_the_consoles_response_format_nested_5000_levels_is_the_forms_error(
        organization: Organization) -> None:
    client, _user = signed_in(organization)
    item = input_ready(organization, chat_request_line("r1"))
    page = client.post("/console/jobs/new", form(organization, {
        "input_id": str(item.pk), "model": "gemma4-12b",
        "response_format": "[" * 5000 + "]" * 5000}))
    assert page.status_code == 200
    assert "The response format nests JSON arrays and objects more than 128 levels deep." \
        in page.content.decode()
    assert not Job.objects.for_org(organization).exists()

