"""/openapi.json says exactly what the API does: Schemathesis runs every phase (examples,
coverage, fuzzing, and stateful sequences through the document's links) with every check,
against the app in process (WSGI) on the test database with a real key, and finds nothing
but the answers the reference documents for what no schema can state (`accepted`).

The realtime engines are a local server answering as the engines do (it refuses a
question the decision model refuses); no host name resolves, as on a machine without DNS,
so an ingest never contacts its source. What the runs found on the way is pinned below.
"""

from __future__ import annotations

import json
import re
import socket
import uuid
import zlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import pytest
from django.db import connections
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.wsgi import application
from billing.services import credits_grant
from console.models import Organization
from inference.catalog import catalog_all
from inference.kinds.chat import BUDGET_HEADROOM
from jobs.constants import JobStatus
from jobs.dispatch import ACTOR_QUEUES
from jobs.idempotency import HEADER, KEY_MAX_LENGTH, MISMATCH_DETAIL
from realtime.selectors import realtime_frozen_forget
from tests.dispatched import dispatch_catch
from tests.factories import SYSTEM, api_key_make, chat_request_line, input_ready, job_make
from tests.lazy import lazy_module
from tests.servers import LocalServer, reply

if TYPE_CHECKING:
    import schemathesis
    import schemathesis.engine.events as events
    import schemathesis.openapi
else:  # imported by the one test that runs it, not by every worker's collection
    schemathesis = lazy_module("schemathesis")
    events = lazy_module("schemathesis.engine.events")

# Bounded, and derandomized with a fixed seed: the same run every time, in well under a
# minute (20 CPU-seconds on 2 cores: it runs with the slow tiers, marked fuzz). The
# coverage phase is not bounded by it; it covers every schema rule once.
MAX_EXAMPLES = 6
SEED = 20260726
SUBMITS = ("POST /batch/v1/jobs", "POST /batch/v1/checks")
# Answers to a request that is well formed but meets the state it finds: an unknown id
# (404), a job or input in another state (409), data already deleted (410, the
# reference's "the result data has been deleted"), a limit reached (429).
STATE_ANSWERS = ["2xx", "3xx", "401", "403", "404", "409", "410", "429", "5xx"]

# The reference's answers to requests a schema calls valid, each for a reason JSON Schema
# cannot state: (Schemathesis' failure code, status, the detail's pattern).
ACCEPTED = (
    # Whether a host resolves to a public address is known only once it is looked up.
    ("ST202", 400, r"^source_url cannot be fetched: \S+ is not a public internet address$"),
    # JSON Schema cannot compare two values; the schema says this one in words.
    ("ST202", 422, rf"^reasoning_budget must be at least {BUDGET_HEADROOM} below "
                   r"max_output_tokens "),
    # A key used before for another request (the header's own description): the coverage
    # phase sends the same few keys to every operation.
    ("ST202", 422, "^" + re.escape(MISMATCH_DETAIL) + "$"),
    # A form part's headers with control characters in a field's name (the generator
    # writes any string as a name; multipart cannot carry them): the form is unreadable,
    # as OpenAI answers one (anex.multipart; it was a 500 before).
    ("ST202", 400, r"^the body is not a multipart/form-data form: "),
)
NOT_AN_INTEGER = "A valid integer is required."


def accepted(failure: Any, case: Any, response: Any) -> bool:
    """Whether this failure is the reference's own answer rather than a finding."""
    if failure.code == "ST401":
        # Without a key the reference answers 422 (anex/api/errors.py, MISSING_KEY_DETAIL),
        # not 401: the probe without credentials is the one scenario that may get it.
        return str(failure.scenario.value) == "no_auth" and "got `422 " in failure.message
    try:
        answer = response.json()
    except ValueError:
        return False
    if not isinstance(answer, dict):
        return False
    # The OpenAI surface (/openai/v1) says the same in OpenAI's envelope.
    openai_error = answer.get("error")
    detail = str(answer.get("detail", "") or (
        openai_error.get("message", "") if isinstance(openai_error, dict) else ""))
    errors = answer.get("errors")
    if failure.code == "ST202" and response.status_code == 422 and isinstance(errors, dict) \
            and isinstance(case.body, dict) and all(
                messages == [NOT_AN_INTEGER] and isinstance(case.body.get(name), float)
                for name, messages in errors.items()):
        # JSON Schema counts 799.0 as an integer; this API reads integers written as such.
        return True
    return any((failure.code, response.status_code) == (code, status)
               and re.search(pattern, detail) for code, status, pattern in ACCEPTED)


def fresh_idempotency_key(context: Any, headers: dict[str, Any] | None) -> Any:
    """A valid generated Idempotency-Key made unique, as a client makes one per request it
    means to send once (it stays printable ASCII, at most KEY_MAX_LENGTH long)."""
    key = (headers or {}).get(HEADER)
    if headers is not None and isinstance(key, str) and 0 < len(key) <= KEY_MAX_LENGTH \
            and all(" " <= ch <= "~" for ch in key):
        headers[HEADER] = f"{key[:KEY_MAX_LENGTH - 33]}-{uuid.uuid4().hex}"
    return headers


def question_refusal(raw: object) -> str | None:
    """The decision model's refusal of a question's shape (inference/engines/decisions.py)."""
    if not isinstance(raw, dict):
        return "must be an object with a type, instructions and criteria."
    kind, instructions, criteria = raw.get("type"), raw.get("instructions"), raw.get("criteria")
    if kind not in ("choice", "noul", "score"):
        return f"has type {kind!r}: a question's type is choice, noul or score."
    if not isinstance(instructions, str) or not instructions.strip():
        return "has no instructions."
    if kind == "choice" and not (isinstance(criteria, dict) and len(criteria) >= 2
                                 and all(isinstance(text, str) for text in criteria.values())):
        return "is a choice: its criteria must be two or more described options."
    if kind == "noul" and criteria is not None and not (
            isinstance(criteria, dict) and set(criteria) <= {"true", "false"}
            and all(isinstance(text, str) for text in criteria.values())):
        return "is a noul: its criteria are keyed true and false only."
    if kind == "score" and not (isinstance(criteria, list) and len(criteria) >= 2
                                and all(isinstance(text, str) for text in criteria)):
        return "is a score: its criteria must be two or more level descriptions."
    return None


def engine_answer(handler: Any) -> None:
    """A realtime engine server's answer: a vector per input, or an answer per question."""
    sent = json.loads(handler.server.owner.requests[-1].body)
    if handler.path == "/v1/embeddings":
        width = sent.get("dimensions") or 32
        body: dict[str, Any] = {"data": [{"embedding": [1.0] + [0.0] * (width - 1),
                                          "prompt_tokens": 3} for _ in sent["input"]]}
    else:
        routing = {"model": "english", "reason": "the text is Latin script"}
        refused = [(name, why) for name, raw in sent["questions"].items()
                   if (why := question_refusal(raw))]
        body = ({"error": {"message": f"Question '{refused[0][0]}' {refused[0][1]}",
                           "type": "invalid_request_error"}, "routing": routing} if refused
                else {"answers": {name: {"type": raw["type"], "confidence": 0.5,
                                         "answer_confidence": 0.5}
                                  for name, raw in sent["questions"].items()},
                      "input_tokens": 9, "routing": routing})
    reply(handler, body=json.dumps(body).encode())


@pytest.fixture
def engines(settings: Settings, server: LocalServer) -> LocalServer:
    """Every catalog model with a realtime rate, served by the local engine server."""
    server.routes["/v1/embeddings"] = server.routes["/v1/systemone"] = engine_answer
    settings.ANEX_REALTIME_ENGINES = {
        model_id: server.url("") for model_id, model in catalog_all().items()
        if model.price.realtime_input_per_mtok is not None}
    realtime_frozen_forget()
    return server


@pytest.fixture
def no_dns(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fetcher (anex/net.py) resolves no name but this machine's own."""
    import anex.net

    real = socket.getaddrinfo

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host in ("127.0.0.1", "localhost", "::1"):
            return real(host, *args, **kwargs)
        raise socket.gaierror(socket.EAI_NONAME, "no name resolves in this test")

    class Resolver:
        def __getattr__(self, name: str) -> Any:
            return getaddrinfo if name == "getaddrinfo" else getattr(socket, name)

    monkeypatch.setattr(anex.net, "socket", Resolver())


@pytest.fixture
def in_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Schemathesis calls the app from its own threads; each thread's database connection
    is closed once the run is over, so the test database can be dropped. And Schemathesis
    4.32.5 hands its ignored_auth probes to the WSGI transport with the network-only
    options (max_redirects, verify, cert) it strips only beside a session, which werkzeug
    refuses: they are stripped for every call."""
    from schemathesis.transport.wsgi import WSGITransport

    send = WSGITransport.send
    used: dict[int, Any] = {}

    def send_in_process(self: WSGITransport, case: Any, **kwargs: Any) -> Any:
        for name in ("max_redirects", "verify", "cert", "proxies"):
            kwargs.pop(name, None)
        try:
            return send(self, case, **kwargs)
        finally:
            wrapper = connections["default"]
            used[id(wrapper)] = wrapper

    monkeypatch.setattr(WSGITransport, "send", send_in_process)
    yield
    for wrapper in used.values():
        wrapper.inc_thread_sharing()
        wrapper.close()


@pytest.fixture
def nothing_sent(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    caught: list[Any] = []
    dispatch_catch(monkeypatch, caught.append, *ACTOR_QUEUES)
    return caught


def seeded(organization: Organization) -> dict[str, list[str]]:
    """Ids the generated requests draw on, so that they reach past an unknown id's 404."""
    rows = b"".join(chat_request_line(f"r{i}") for i in range(3))
    inputs = [str(input_ready(organization, rows).pk) for _ in range(2)]
    jobs = [str(job_make(organization, status=status, model=model).pk)
            for status, model in ((JobStatus.COST_READY, "gemma4-12b"),
                                  (JobStatus.IN_PROGRESS, "qwen3-embedding-8b"),
                                  (JobStatus.FAILED, "laya"), (JobStatus.CANCELLED, "gemma4-12b"))]
    return {"inputs": inputs, "jobs": jobs}


def findings(schema: Any) -> tuple[list[str], int]:
    """Every failure the run kept, with the answer it got, and how many cases it ran."""
    found: list[str] = []
    cases = 0
    for event in schemathesis.engine.from_schema(schema).execute():
        if isinstance(event, events.NonFatalError | events.FatalError):
            found.append(f"error: {event!r}")
        if not isinstance(event, events.ScenarioFinished):
            continue
        cases += len(event.recorder.cases)
        for case_id, checks in event.recorder.checks.items():
            interaction = event.recorder.interactions.get(case_id)
            response = interaction.response if interaction is not None else None
            answer = ("no response" if response is None
                      else f"{response.status_code} {response.content[:300]!r}")
            found += [f"{info.failure.operation}: {info.failure.code} {info.failure.title}: "
                      f"{info.failure.message}\n  answered {answer}\n  {info.code_sample}"
                      for info in (check.failure_info for check in checks) if info]
    return found, cases


@pytest.mark.fuzz  # with the slow tiers (tests/conftest.py): the fast tier keeps the pins below
@pytest.mark.django_db(transaction=True)
def test_schemathesis_finds_nothing_but_the_references_own_answers(
        organization: Organization, engines: LocalServer, no_dns: None, in_process: None,
        nothing_sent: list[Any]) -> None:
    # given a key no rate limit stops, credits, and ids for the generated requests to use
    _key, plaintext = api_key_make(organization, rate_limit_per_minute=1_000_000)
    credits_grant(organization=organization, cents=1_000_000, reason="schemathesis",
                  actor=SYSTEM)
    ids = seeded(organization)
    config = schemathesis.Config.from_dict({
        "seed": SEED, "workers": 1, "cache": {"enabled": False},
        "headers": {"Authorization": f"Bearer {plaintext}"},
        "generation": {"max-examples": MAX_EXAMPLES, "deterministic": True,
                       "database": "none"},
        "phases": {"examples": {"enabled": True}, "fuzzing": {"enabled": True},
                   "stateful": {"enabled": True},
                   "coverage": {"enabled": True, "unexpected-methods": ["PATCH"]}},
        "checks": {"enabled": True,
                   "positive_data_acceptance": {"expected-statuses": STATE_ANSWERS}},
        "dictionaries": {name: {"values": values} for name, values in ids.items()},
        "parameters": {"path.input_id": {"dictionary": "inputs", "probability": 0.5},
                       "path.job_id": {"dictionary": "jobs", "probability": 0.5}},
        # POST /checks takes POST /jobs' body, read by the same code: covered there once.
        "operations": [{"include-operation-id": "createCheck",
                        "phases": {"coverage": {"enabled": False}}}],
        # (The openai upload, POST /openai/v1/files, was left out from 6e686d5 on: one
        # generated form was answered 400 "the request ended inside the file", in the
        # whole fast tier only. Run again in the whole tier twice and alone, every case is
        # answered as the reference says, a well-formed upload 200, so it is covered here.)
    })
    schema = schemathesis.openapi.from_wsgi("/openapi.json", application, config=config)
    schema.hook("map_headers")(fresh_idempotency_key)

    @schema.hook
    def map_case(context: Any, case: Any) -> Any:
        # A valid submit or check names a ready input two times in three (a dictionary
        # binding would also overwrite the one value a negative case breaks).
        body = case.body
        if case.meta is not None and case.meta.generation.mode.is_positive \
                and case.operation.label in SUBMITS and isinstance(body, dict) \
                and isinstance(body.get("input_id"), str) and body.get("input_s3_uri") is None:
            pick = zlib.crc32(body["input_id"].encode())
            if pick % 3:
                body["input_id"] = ids["inputs"][pick % len(ids["inputs"])]
        return case

    @schema.hook
    def filter_failure(context: Any, failure: Any, case: Any, response: Any) -> bool:
        return not accepted(failure, case, response)

    # when
    found, cases = findings(schema)

    # then
    assert not found, "\n".join(found)
    assert cases > 500, f"only {cases} test cases ran"


# -- what Schemathesis found, answered as the reference says ------------------------------

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
    job = ("getJob", "getJobProgress", "getJobResult", "getJobRows", "approveJob", "cancelJob",
           "rerunJob", "deleteJobData")
    assert found == {
        ("createInput", "200", "getInput", "{'input_id': '$response.body#/id'}"),
        ("createCheck", "202", "getCheck", "{'check_id': '$response.body#/id'}"),
        *{(create, "200", read, "{'job_id': '$response.body#/id'}")
          for create in ("submitJob", "rerunJob") for read in job}}
    assert all(by_id[link[2]] for link in found)  # every link names a real operation
