"""The realtime API's answers before and around the engine, through HTTP: every error the
reference names (400, 402, 403, 421, 422, 429, 501, 502, 503), the key-aware model list,
the operator's switch, and the meter that bills realtime usage into the ledger.

The engine here is a local HTTP server standing where a realtime engine server listens:
it records what reached it (nothing, for every refusal), holds requests in flight for the
concurrency tests, and fails on purpose for the 502s. The real engines answer in
test_realtime_engines.py.
"""

from __future__ import annotations

import base64
import json
import math
import struct
import threading
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from pytest_django import Settings
from rest_framework.test import APIClient

from billing.constants import EntryKind
from billing.models import LedgerEntry
from billing.services import credits_grant, credits_summary, key_spend_cents
from billing.unsettled import slots_key
from console.models import ApiKey, Organization
from inference.catalog import model_get
from inference.checkpoints import STAMP
from realtime.concurrency import concurrency_slot, slots_in_flight
from realtime.constants import Endpoint
from realtime.models import RealtimeSettlement, RealtimeSwitch, RealtimeUsage
from realtime.selectors import realtime_frozen_forget
from realtime.services.admission import realtime_credits_forget, realtime_switch_set
from realtime.services.settlement import (
    realtime_charges_settle,
    realtime_charges_settle_all,
    realtime_usage_record,
)
from tests.factories import SYSTEM, api_key_make, organization_make
from tests.servers import LocalServer, free_port, reply

pytestmark = pytest.mark.django_db
EMBED, DECIDE, MODELS = ("/realtime/v1/embeddings", "/realtime/v1/systemone",
                         "/realtime/v1/models")
MINILM = "all-minilm-l6-v2"
QUESTIONS = {"urgent": {"type": "noul", "instructions": "Does the customer need an answer "
                                                       "today?"}}


def vector_answer(handler: Any) -> None:
    """An engine's answer to whatever it was sent: one unit vector per input."""
    sent = json.loads(handler.server.owner.requests[-1].body)
    reply(handler, body=json.dumps({"data": [
        {"embedding": [1.0] + [0.0] * 383, "prompt_tokens": 5} for _ in sent["input"]]}
    ).encode())


def decision_answer(handler: Any) -> None:
    reply(handler, body=json.dumps({
        "answers": {"urgent": {"type": "noul", "noul": 0.9, "confidence": 0.9,
                               "answer_confidence": 0.9}},
        "input_tokens": 21, "routing": {"model": "english", "reason": "text is 100% Latin"},
    }).encode())


@pytest.fixture(autouse=True)
def switch_read_afresh() -> Iterator[None]:
    """Each test reads the operator's switch from its own database state, not from the
    second-long read another test's requests left in this process."""
    realtime_frozen_forget()
    yield
    realtime_frozen_forget()


@pytest.fixture
def engine(settings: Settings, server: LocalServer, tmp_path: Path) -> LocalServer:
    """The realtime engines of a deployment: MiniLM and laya, at the test server."""
    server.routes["/v1/embeddings"] = vector_answer
    server.routes["/v1/systemone"] = decision_answer
    settings.ANEX_REALTIME_ENGINES = {MINILM: server.url(""), "laya": server.url("")}
    return server


def ledger_total(organization: Organization) -> int:
    return credits_summary(organization=organization).balance


def refused(response: Any, status: int, engine: LocalServer) -> dict[str, Any]:
    """The request was answered `status` in the envelope, and nothing reached the engine."""
    assert response.status_code == status, response.content
    assert engine.requests == []
    body: dict[str, Any] = response.json()
    assert isinstance(body["detail"], str)
    return body


# -- the happy path around the engine ------------------------------------------------------

def test_an_embedding_is_forwarded_verbatim_and_billed_once(
        api: APIClient, api_key: ApiKey, engine: LocalServer) -> None:
    response = api.post(EMBED, {"model": MINILM, "input": "  a query\n", "dimensions": 64},
                        format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["object"] == "list" and body["model"] == MINILM
    assert body["data"][0]["object"] == "embedding" and body["data"][0]["index"] == 0
    assert body["usage"] == {"prompt_tokens": 5, "total_tokens": 5}
    # The string reaches the engine verbatim, as a one-item list (the reference).
    assert json.loads(engine.requests[0].body) == {"model": MINILM, "input": ["  a query\n"],
                                                   "dimensions": 64}
    usage = RealtimeUsage.objects.get()
    assert (usage.api_key_id, usage.endpoint, usage.input_tokens) == (
        api_key.pk, Endpoint.EMBEDDINGS, 5)
    assert usage.cost_usd == Decimal(5) * Decimal("0.002") / 1_000_000


def test_base64_is_answered_as_openai_answers_it_and_float_as_floats(
        api: APIClient, engine: LocalServer) -> None:
    # base64 (what the OpenAI SDK asks for when its caller names no encoding_format, and
    # what a caller asking for base64 decodes): little-endian float32, base64-encoded.
    response = api.post(EMBED, {"model": MINILM, "input": ["a", "b"],
                                "encoding_format": "base64"}, format="json")
    assert response.status_code == 200, response.content
    for item in response.json()["data"]:
        raw = base64.b64decode(item["embedding"])
        assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == [1.0] + [0.0] * 383
    response = api.post(EMBED, {"model": MINILM, "input": "a", "encoding_format": "float"},
                        format="json")
    assert response.json()["data"][0]["embedding"] == [1.0] + [0.0] * 383


def test_a_decision_comes_back_in_the_reference_shape(api: APIClient,
                                                      engine: LocalServer) -> None:
    response = api.post(DECIDE, {"model": "laya", "state": {"body": "Refund me today."},
                                 "questions": QUESTIONS, "lang": "en"}, format="json")
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {"model", "answers", "usage", "routing"}
    assert body["usage"] == {"input_tokens": 21, "output_tokens": 0}
    assert json.loads(engine.requests[0].body) == {
        "model": "laya", "state": {"body": "Refund me today."}, "questions": QUESTIONS,
        "lang": "en"}
    assert RealtimeUsage.objects.get().endpoint == Endpoint.SYSTEMONE


# -- GET /models ---------------------------------------------------------------------------

def test_the_model_list_is_openai_shaped_key_aware_and_marks_stand_ins(
        settings: Settings, organization: Organization, client_for: Callable[[str], APIClient],
        engine: LocalServer, tmp_path: Path) -> None:
    built, published = tmp_path / "built", tmp_path / "published"
    built.mkdir()
    published.mkdir()
    (built / STAMP).write_text("{}")  # what build_checkpoints leaves in a local checkpoint
    settings.ANEX_CHECKPOINTS = {MINILM: built, "laya": built, "tiny-qwen3": built,
                                 "qwen3-embedding-8b": published}
    _key, everything = api_key_make(organization)
    body = client_for(everything).get(MODELS).json()
    assert body["object"] == "list"
    listed = {m["id"]: m for m in body["data"]}
    assert set(listed) == {MINILM, "laya", "tiny-qwen3", "qwen3-embedding-8b"}
    assert listed[MINILM] == {"id": MINILM, "object": "model", "created": 0,
                              "owned_by": "anex", "task": "embed", "realtime": True,
                              "local": True}
    assert (listed["laya"]["task"], listed["laya"]["realtime"], listed["laya"]["local"]) == (
        "decide", True, True)
    assert (listed["tiny-qwen3"]["task"], listed["tiny-qwen3"]["realtime"]) == ("chat", False)
    assert (listed["qwen3-embedding-8b"]["realtime"],
            listed["qwen3-embedding-8b"]["local"]) == (False, False)
    _key, scoped = api_key_make(organization, model_scopes=["laya"])
    assert [m["id"] for m in client_for(scoped).get(MODELS).json()["data"]] == ["laya"]


def test_a_model_outside_the_keys_scopes_is_refused_like_an_unknown_id(
        organization: Organization, client_for: Callable[[str], APIClient],
        engine: LocalServer) -> None:
    _key, scoped = api_key_make(organization, model_scopes=["laya"])
    body = refused(client_for(scoped).post(EMBED, {"model": MINILM, "input": "x"},
                                           format="json"), 422, engine)
    assert body["detail"].startswith(f"Unknown model '{MINILM}'")
    refused(client_for(scoped).post(EMBED, {"model": "no-such-model", "input": "x"},
                                    format="json"), 422, engine)


# -- 400 and 422: the request itself -------------------------------------------------------

def test_laya_on_embeddings_and_an_embedding_model_on_systemone_point_at_each_other(
        api: APIClient, engine: LocalServer) -> None:
    body = refused(api.post(EMBED, {"model": "laya", "input": "x"}, format="json"), 400, engine)
    assert "POST /realtime/v1/systemone" in body["detail"]
    body = refused(api.post(DECIDE, {"model": MINILM, "state": "x", "questions": QUESTIONS},
                            format="json"), 400, engine)
    assert "POST /realtime/v1/embeddings" in body["detail"]


@pytest.mark.parametrize("payload,named", [
    ({"input": ["x"] * 129}, "over the 128-input limit"),
    ({"input": ["a" * 262_145]}, "262,145 characters, over the 262,144-character limit"),
    # Nine inputs each within the per-input limit, 2,359,296 characters in all: a body over
    # the API's 2 MiB cap, which this endpoint's own cap lets through to be answered 400.
    ({"input": ["a" * 262_144] * 9}, "2,359,296 characters in all, over the 2,097,152"),
    ({"input": [{"type": "image_url", "image_url": {"url": "https://x.test/a.png"}}]},
     "realtime requests are text only"),
    ({"input": [[{"type": "text", "text": "a"}]]}, "realtime requests are text only"),
    ({"input": ""}, "input[0] is an empty string"),
    ({"input": []}, "input is an empty list"),
    ({"input": "x", "encoding_format": "int8"}, 'encoding_format must be "float"'),
])
def test_embedding_requests_past_the_references_limits_are_400(
        api: APIClient, engine: LocalServer, payload: dict[str, Any], named: str) -> None:
    body = refused(api.post(EMBED, {"model": MINILM, **payload}, format="json"), 400, engine)
    assert named in body["detail"]


def test_the_character_limits_are_exact(api: APIClient, engine: LocalServer) -> None:
    response = api.post(EMBED, {"model": MINILM, "input": ["a" * 262_144] * 8},
                        format="json")
    assert response.status_code == 200, response.content  # 2,097,152 in all: at the limit


@pytest.mark.parametrize("payload,named", [
    ({"input": "x", "dimensions": 31}, "dimensions must be from 32 to 384"),
    ({"input": "x", "dimensions": 385}, "dimensions must be from 32 to 384"),
    ({"input": 7}, "input must be a string or a list of strings"),
    ({"input": ["x", 7]}, "input[1] must be a string"),
    ({}, "input"),
])
def test_malformed_embedding_requests_are_422(api: APIClient, engine: LocalServer,
                                              payload: dict[str, Any], named: str) -> None:
    body = refused(api.post(EMBED, {"model": MINILM, **payload}, format="json"), 422, engine)
    assert named in body["detail"]


@pytest.mark.parametrize("payload,status,named", [
    ({"questions": {f"q{i}": QUESTIONS["urgent"] for i in range(65)}}, 400,
     "65 questions, over the 64-question limit of model 'laya'"),
    ({"state": "a" * 50_001}, 400, "50,001 characters, over the 50,000-character limit"),
    ({"state": {"body": "a" * 49_990}}, 400, "characters as JSON, over the 50,000"),
    ({"temperature": 0}, 422, "temperature: Unrecognized request argument supplied."),
    ({"state": 7}, 422, "state must be the text to decide on"),
    ({"questions": {}}, 422, "questions must be an object of named questions"),
    ({"model": None}, 422, "model"),
])
def test_decision_requests_past_the_limits_are_400_and_malformed_ones_422(
        api: APIClient, engine: LocalServer, payload: dict[str, Any], status: int,
        named: str) -> None:
    body = {"model": "laya", "state": "We were billed twice.", "questions": QUESTIONS,
            **payload}
    answer = refused(api.post(DECIDE, body, format="json"), status, engine)
    assert named in answer["detail"]


def test_a_question_the_model_refuses_is_422_with_its_message_and_bills_nothing(
        api: APIClient, engine: LocalServer, organization: Organization) -> None:
    refusal = {"type": "invalid_request_error", "code": "invalid_question",
               "message": "Question 'q' has no instructions: every question needs its "
                          "instructions, the question itself."}
    engine.routes["/v1/systemone"] = lambda handler: reply(handler, body=json.dumps(
        {"error": refusal, "routing": {"model": "english", "reason": "-"}}).encode())
    before = ledger_total(organization)
    response = api.post(DECIDE, {"model": "laya", "state": "x",
                                 "questions": {"q": {"type": "noul"}}}, format="json")
    assert response.status_code == 422
    assert response.json() == {"detail": refusal["message"]}
    assert not RealtimeUsage.objects.exists() and ledger_total(organization) == before


# -- 402 -----------------------------------------------------------------------------------

def test_no_credits_is_402_before_the_engine_and_bills_nothing(
        settings: Settings, client_for: Callable[[str], APIClient], engine: LocalServer) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 0
    broke = organization_make()
    _key, plaintext = api_key_make(broke)
    for path, body in ((EMBED, {"model": MINILM, "input": "x"}),
                       (DECIDE, {"model": "laya", "state": "x", "questions": QUESTIONS})):
        answer = refused(client_for(plaintext).post(path, body, format="json"), 402, engine)
        assert "no credits left" in answer["detail"]
    assert not RealtimeUsage.objects.exists()
    assert LedgerEntry.objects.filter(organization=broke).count() == 0


def test_a_key_whose_spend_budget_is_used_up_is_402(
        organization: Organization, client_for: Callable[[str], APIClient],
        engine: LocalServer) -> None:
    _key, plaintext = api_key_make(organization, spend_budget_cents=0)
    body = refused(client_for(plaintext).post(EMBED, {"model": MINILM, "input": "x"},
                                              format="json"), 402, engine)
    assert "spend budget is used up" in body["detail"]


# -- 403 and 421: regions ------------------------------------------------------------------

def test_the_eu_host_is_403_for_an_organization_without_eu_routing(
        api: APIClient, engine: LocalServer) -> None:
    body = refused(api.post(EMBED, {"model": MINILM, "input": "x"}, format="json",
                            HTTP_HOST="api-eu.anex.sh"), 403, engine)
    assert body == {"detail": "EU data routing is not enabled for this organization. "
                              "Contact us to enable it."}


def test_an_eu_organization_is_served_on_the_eu_host_and_sent_there_from_the_main_one(
        client_for: Callable[[str], APIClient], engine: LocalServer) -> None:
    _key, plaintext = api_key_make(organization_make(eu_data_routing=True))
    eu = client_for(plaintext)
    body = refused(eu.post(EMBED, {"model": MINILM, "input": "x"}, format="json"), 421, engine)
    assert body == {"detail": "this organization's data is stored in the EU region; use "
                              "https://api-eu.anex.sh",
                    "residency": "eu", "api": "https://api-eu.anex.sh"}
    answer = eu.post(EMBED, {"model": MINILM, "input": "x"}, format="json",
                     HTTP_HOST="api-eu.anex.sh")
    assert answer.status_code == 200, answer.content


# -- 429: the organization's concurrency ---------------------------------------------------

def test_past_the_concurrency_limit_is_429_with_retry_after(
        settings: Settings, api: APIClient, api_key: ApiKey, organization: Organization,
        engine: LocalServer) -> None:
    settings.ANEX_REALTIME_CONCURRENCY = 1
    with concurrency_slot(key=api_key):  # another request in flight
        response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
        body = refused(response, 429, engine)
        assert response["Retry-After"] == "1"
        assert body["error"]["code"] == "concurrency_limit_exceeded"
        # Another organization has slots of its own.
        _key, other = api_key_make(organization_make())
        assert APIClient(HTTP_AUTHORIZATION=f"Bearer {other}").post(
            EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200
    assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200
    assert slots_in_flight(organization_id=organization.pk) == 0  # every slot given back


def test_a_key_past_its_rate_limit_is_429_counted_in_the_apis_one_window(
        organization: Organization, client_for: Callable[[str], APIClient],
        engine: LocalServer) -> None:
    _key, plaintext = api_key_make(organization, rate_limit_per_minute=2)
    client = client_for(plaintext)
    # given one request through the API's throttle (the batch API's; the model list has
    # it) and one realtime request of the key this minute
    assert client.get(MODELS).status_code == 200
    assert client.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200
    # when a third arrives
    response = client.post(DECIDE, {"model": "laya", "state": "x", "questions": QUESTIONS},
                           format="json")
    # then it is refused as the batch API's throttle refuses, and nothing reached the engine
    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert int(response["Retry-After"]) >= 1
    assert len(engine.requests) == 1 and RealtimeUsage.objects.count() == 1
    assert slots_in_flight(organization_id=organization.pk) == 0


def test_a_slot_left_by_a_crashed_request_lapses(settings: Settings, api: APIClient,
                                                 organization: Organization,
                                                 engine: LocalServer) -> None:
    from anex.redis import redis_client

    settings.ANEX_REALTIME_CONCURRENCY = 1
    # What a process killed mid-request leaves behind, once its slot's lifetime has passed.
    redis_client().zadd(slots_key(organization.pk), {"crashed": time.time() - 1})
    assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200
    assert redis_client().zscore(slots_key(organization.pk), "crashed") is None


@pytest.mark.django_db(transaction=True)
def test_concurrent_requests_past_the_limit_get_429_and_the_rest_are_served(
        settings: Settings, server: LocalServer) -> None:
    # given an engine that holds every request until released, and a limit of 2
    settings.ANEX_REALTIME_CONCURRENCY = 2
    settings.ANEX_REALTIME_ENGINES = {MINILM: server.url("")}
    arrived = threading.Semaphore(0)

    def held(handler: Any) -> None:
        arrived.release()
        server.release.wait(30)
        vector_answer(handler)

    server.routes["/v1/embeddings"] = held
    _key, plaintext = api_key_make(organization_make())
    statuses: list[int] = []

    def call() -> None:
        client = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        statuses.append(client.post(EMBED, {"model": MINILM, "input": "x"},
                                    format="json").status_code)
        connection.close()

    # when six arrive at once
    threads = [threading.Thread(target=call) for _ in range(6)]
    for thread in threads:
        thread.start()
    assert arrived.acquire(timeout=30) and arrived.acquire(timeout=30)
    deadline = time.monotonic() + 30
    while len(statuses) < 4 and time.monotonic() < deadline:
        time.sleep(0.05)
    server.release.set()
    for thread in threads:
        thread.join(30)
    # then two reached the engine and were billed, four were refused
    assert sorted(statuses) == [200, 200, 429, 429, 429, 429]
    assert len(server.requests) == 2 and RealtimeUsage.objects.count() == 2


# -- 501 -----------------------------------------------------------------------------------

@pytest.mark.parametrize("model,named", [
    ("qwen3-embedding-8b", "this deployment has no realtime engine for it"),
    ("tiny-qwen3", "is a chat model, not served in realtime"),
    ("qwen3.8-27b", "is a chat model, not served in realtime"),
])
def test_a_catalog_model_not_served_in_realtime_is_501(api: APIClient, engine: LocalServer,
                                                       model: str, named: str) -> None:
    body = refused(api.post(EMBED, {"model": model, "input": "x"}, format="json"), 501, engine)
    assert named in body["detail"]


# -- 502 -----------------------------------------------------------------------------------

def test_an_engine_that_does_not_answer_is_502_and_bills_nothing(
        settings: Settings, api: APIClient, organization: Organization) -> None:
    settings.ANEX_REALTIME_ENGINES = {MINILM: f"http://127.0.0.1:{free_port()}",
                                      "laya": f"http://127.0.0.1:{free_port()}"}
    before = ledger_total(organization)
    response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
    assert response.status_code == 502
    assert "failed to answer" in response.json()["detail"]
    response = api.post(DECIDE, {"model": "laya", "state": "x", "questions": QUESTIONS},
                        format="json")
    assert response.status_code == 502
    assert "decision service failed to answer" in response.json()["detail"]
    assert not RealtimeUsage.objects.exists() and ledger_total(organization) == before


def test_an_engine_that_fails_is_502(api: APIClient, engine: LocalServer) -> None:
    engine.routes["/v1/embeddings"] = lambda handler: reply(
        handler, 500, b'{"detail": "the engine failed: out of memory"}')
    response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
    assert response.status_code == 502
    assert "out of memory" not in response.json()["detail"]  # the engine's words stay ours
    assert not RealtimeUsage.objects.exists()


def test_a_decision_the_engine_failed_on_is_502_not_the_callers_422(
        api: APIClient, engine: LocalServer) -> None:
    # The engine server's answer when its step failed on the request alone (feed.py).
    engine.routes["/v1/systemone"] = lambda handler: reply(handler, body=json.dumps({
        "error": {"type": "server_error", "code": "engine_error",
                  "message": "The model failed while generating this row"},
        "routing": {"model": "english", "reason": "text is 100% Latin"}}).encode())
    response = api.post(DECIDE, {"model": "laya", "state": "x", "questions": QUESTIONS},
                        format="json")
    assert response.status_code == 502
    assert response.json()["detail"].startswith(
        "The decision service failed on a question of this request (the model failed on it, "
        "and again when it was run alone), so no question was answered and nothing was "
        "billed.")
    assert not RealtimeUsage.objects.exists()


# -- 503 -----------------------------------------------------------------------------------

def test_a_frozen_realtime_api_is_503_with_retry_after(api: APIClient,
                                                       engine: LocalServer) -> None:
    realtime_switch_set(frozen=True, reason="engine upgrade", user=None)
    for path, body in ((EMBED, {"model": MINILM, "input": "x"}),
                       (DECIDE, {"model": "laya", "state": "x", "questions": QUESTIONS})):
        response = api.post(path, body, format="json")
        answer = refused(response, 503, engine)
        assert int(response["Retry-After"]) >= 1
        assert "paused for maintenance" in answer["detail"]
    assert api.get(MODELS).status_code == 200  # listing touches no engine and no ledger
    realtime_switch_set(frozen=False, user=None)
    assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200


def test_staff_freeze_the_realtime_api_in_the_admin(api: APIClient,
                                                    engine: LocalServer) -> None:
    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser(
        "staff", "staff@example.com", "pw-staff-1"))
    response = staff.post("/admin/realtime/realtimeswitch/add/",
                          {"frozen": "on", "reason": "maintenance"})
    assert response.status_code == 302, response.content
    switch = RealtimeSwitch.objects.get()
    assert switch.frozen and switch.changed_by is not None
    assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 503


@pytest.mark.django_db(transaction=True)
def test_a_balance_that_cannot_be_read_is_503_and_nothing_is_sent(
        settings: Settings, engine: LocalServer) -> None:
    _key, plaintext = api_key_make(organization_make())
    api = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    # Another session holds the ledger table (a migration, a stuck transaction), and the
    # database cancels the balance read at its statement timeout.
    db = connection.settings_dict
    with psycopg.connect(dbname=db["NAME"], user=db["USER"], password=db["PASSWORD"],
                         host=db["HOST"], port=db["PORT"] or None) as other:
        other.execute("LOCK TABLE billing_ledgerentry IN ACCESS EXCLUSIVE MODE")
        with connection.cursor() as cursor:  # the connection this request is served on
            cursor.execute("SET statement_timeout = 500")
        try:
            response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
        finally:
            with connection.cursor() as cursor:
                cursor.execute("RESET statement_timeout")
            other.rollback()
    answer = refused(response, 503, engine)
    assert "balance could not be read" in answer["detail"]
    assert int(response["Retry-After"]) >= 1
    assert not RealtimeUsage.objects.exists()


# -- the meter and its settlement ---------------------------------------------------------

def later() -> datetime:
    """A settlement cut-off past every row written so far (the margin is for live rows)."""
    return timezone.now() + timedelta(seconds=1)


def test_usage_is_metered_exactly_and_charged_in_whole_credits(
        organization: Organization, api_key: ApiKey) -> None:
    # given MiniLM's realtime rate, $0.002 per 1M tokens: 1 credit is 5,000,000 tokens
    model = model_get(MINILM)
    assert model is not None
    credits_grant(organization=organization, cents=10, reason="test", actor=SYSTEM)
    start = ledger_total(organization)
    charged = []
    # when a key uses 3M, then 3M, then 5M tokens, settled after each
    for tokens in (3_000_000, 3_000_000, 5_000_000):
        realtime_usage_record(key=api_key, endpoint=Endpoint.EMBEDDINGS, model=model,
                              input_tokens=tokens)
        charged.append(realtime_charges_settle(key=api_key, settled_before=later()))
    # then the ledger has charged floor($0.022) = 2 credits, as each one was passed
    assert charged == [0, 1, 1]
    assert [u.cost_usd for u in RealtimeUsage.objects.order_by("id")] == [
        Decimal("0.006"), Decimal("0.006"), Decimal("0.010")]
    last = RealtimeSettlement.objects.get(through_usage_id=RealtimeUsage.objects.latest("id").pk)
    assert (last.metered_usd, last.charged_cents) == (Decimal("0.022"), 2)
    charges = LedgerEntry.objects.filter(organization=organization, kind=EntryKind.CHARGE)
    assert sorted(c.balance_delta for c in charges) == [-1, -1]
    assert all(c.api_key_id == api_key.pk and c.job_id is None for c in charges)
    assert ledger_total(organization) == start - 2
    assert key_spend_cents(api_key=api_key) == 2
    # and settling again, with nothing new, charges nothing
    assert realtime_charges_settle(key=api_key, settled_before=later()) == 0
    assert ledger_total(organization) == start - 2


def test_a_settlement_leaves_usage_younger_than_its_margin_for_the_next(
        organization: Organization, api_key: ApiKey) -> None:
    model = model_get(MINILM)
    assert model is not None
    realtime_usage_record(key=api_key, endpoint=Endpoint.EMBEDDINGS, model=model,
                          input_tokens=6_000_000)
    start = ledger_total(organization)
    assert realtime_charges_settle(key=api_key) == 0  # written just now: not yet
    assert not RealtimeSettlement.objects.exists()
    assert realtime_charges_settle_all(settled_before=later()) == 1
    assert ledger_total(organization) == start - 1


def test_usage_through_http_is_settled_by_the_periodic_sweep(
        api: APIClient, api_key: ApiKey, organization: Organization,
        engine: LocalServer) -> None:
    from anex.periodic import SCHEDULE

    assert "realtime.tasks.realtime_charges_settle_task" in {t.actor for t in SCHEDULE}
    for _ in range(3):
        assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200
    realtime_charges_settle_all(settled_before=later())
    settlement = RealtimeSettlement.objects.get(api_key=api_key)
    assert settlement.metered_usd == 3 * Decimal(5) * Decimal("0.002") / 1_000_000
    assert settlement.charged_cents == 0  # a tiny fraction of a credit, carried forward


@pytest.mark.django_db(transaction=True)
def test_concurrent_usage_and_settlements_charge_each_credit_once(settings: Settings) -> None:
    settings.ANEX_FREE_GRANT_CENTS = 100
    organization = organization_make()
    key, _ = api_key_make(organization)
    model = model_get(MINILM)
    assert model is not None
    start = ledger_total(organization)

    def at_once(work: Callable[[], object], times: int = 8) -> None:
        def run() -> None:
            work()
            connection.close()

        threads = [threading.Thread(target=run) for _ in range(times)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

    # given eight requests of one key metered at once (none waits on another)
    at_once(lambda: realtime_usage_record(key=key, endpoint=Endpoint.EMBEDDINGS, model=model,
                                          input_tokens=1_500_000))
    assert RealtimeUsage.objects.filter(api_key=key).count() == 8
    # when eight settlements of it run at once
    cutoff = later()
    at_once(lambda: realtime_charges_settle(key=key, settled_before=cutoff))
    # then the 2.4 credits used are charged 2, once, and the 0.4 carried
    exact = Decimal(8 * 1_500_000) * Decimal("0.002") / 1_000_000 * 100
    assert ledger_total(organization) == start - math.floor(exact)
    assert RealtimeSettlement.objects.filter(api_key=key).count() == 1
    assert RealtimeSettlement.objects.get(api_key=key).metered_usd * 100 == exact


# -- what a request costs the web tier -----------------------------------------------------

@pytest.mark.parametrize("path,body", [
    (EMBED, {"model": MINILM, "input": "x"}),
    (DECIDE, {"model": "laya", "state": "x", "questions": QUESTIONS}),
])
def test_an_answered_request_costs_two_queries_and_three_redis_round_trips(
        api: APIClient, engine: LocalServer, monkeypatch: pytest.MonkeyPatch, path: str,
        body: dict[str, Any]) -> None:
    """The latency budget (docs/realtime.md, "Latency"): once the process holds this
    second's reads of the switch and the balance, a request reads its key and writes its
    usage row (no last-used UPDATE while that is fresh); in Redis it counts its rate before
    its body is parsed (the API's throttle, one pipelined call), takes its slot and
    reserves its cost in one Lua call, and gives both back, metering what it cost, in
    another. (Django's connection health check, CONN_HEALTH_CHECKS, adds a SELECT 1 below
    what the query log sees.)"""
    import redis.connection

    import realtime.selectors
    import realtime.services.admission

    # The once-a-second reads stay held however slowly this test runs.
    monkeypatch.setattr(realtime.services.admission, "CREDITS_READ_EVERY_SECONDS", 3600.0)
    monkeypatch.setattr(realtime.selectors, "FROZEN_READ_EVERY_SECONDS", 3600.0)
    assert api.post(path, body, format="json").status_code == 200  # the reads, last_used_at
    sent: list[bytes] = []
    send = redis.connection.AbstractConnection.send_packed_command

    def counted(self: Any, command: Any, check_health: bool = True) -> None:
        sent.append(command if isinstance(command, bytes) else b"".join(command))
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.AbstractConnection, "send_packed_command", counted)
    with CaptureQueriesContext(connection) as queries:
        assert api.post(path, body, format="json").status_code == 200
    statements = [query["sql"].split(" ", 1)[0] for query in queries.captured_queries]
    assert statements == ["SELECT", "INSERT"], queries.captured_queries
    assert [command.split(b"\r\n")[2] for command in sent] == [b"MULTI", b"EVALSHA",
                                                                b"EVALSHA"]


# -- counted before the engine, billed for the work done (issue 23, item 1) ----------------

@pytest.fixture
def tokenizers(settings: Settings, tokenizer_dir: Path) -> Path:
    """The realtime models' tokenizer in the web tier, as a deployment's checkpoints carry
    it (a real tokenizer.json, trained here)."""
    settings.ANEX_CHECKPOINTS = {MINILM: tokenizer_dir, "laya": tokenizer_dir}
    return tokenizer_dir


def test_an_input_over_the_context_is_400_before_any_engine_reads_the_request(
        api: APIClient, engine: LocalServer, tokenizers: Path,
        organization: Organization) -> None:
    # given the model's tokenizer in the web tier and a request whose second input is past
    # MiniLM's 256-token context
    before = ledger_total(organization)
    response = api.post(EMBED, {"model": MINILM, "input": [
        "a plain text string", "We were billed twice for March. " * 60]}, format="json")
    # then it is refused naming that input, and no engine read any of it: nothing to bill
    body = refused(response, 400, engine)
    assert body["detail"].startswith("input[1]: This row is ")
    assert "tokens, over the 256-token context of model 'all-minilm-l6-v2'" in body["detail"]
    assert not RealtimeUsage.objects.exists() and ledger_total(organization) == before


def test_what_the_web_tier_counted_is_billed_when_an_engine_reports_less(
        api: APIClient, engine: LocalServer, tokenizers: Path) -> None:
    from inference.tokens import token_counter

    engine.routes["/v1/embeddings"] = lambda handler: reply(handler, body=json.dumps(
        {"data": [{"embedding": [1.0] + [0.0] * 383, "prompt_tokens": 0}]}).encode())
    response = api.post(EMBED, {"model": MINILM, "input": "a plain text string"},
                        format="json")
    assert response.status_code == 200, response.content
    count = token_counter(MINILM)
    assert count is not None
    counted = count.prompt_counts(["a plain text string"])[0]
    assert counted > 0
    assert response.json()["usage"]["prompt_tokens"] == counted
    assert RealtimeUsage.objects.get().input_tokens == counted


@pytest.mark.parametrize("path,body,what", [
    (EMBED, {"model": MINILM, "input": ["a plain text string", "bugs and outages"]},
     "embedding"),
    (DECIDE, {"model": "laya", "state": "We were billed twice for March.",
              "questions": QUESTIONS}, "decision"),
])
def test_a_request_the_engine_took_and_did_not_answer_in_time_is_billed_for_its_work(
        settings: Settings, api: APIClient, engine: LocalServer, tokenizers: Path,
        path: str, body: dict[str, Any], what: str) -> None:
    settings.ANEX_REALTIME_TIMEOUT_SECONDS = 1

    def slow(handler: Any) -> None:
        engine.release.wait(3)  # the engine works past the web tier's timeout

    engine.routes["/v1/embeddings"] = engine.routes["/v1/systemone"] = slow
    started = time.monotonic()
    response = api.post(path, body, format="json")
    assert response.status_code == 502, response.content
    assert time.monotonic() - started < 2.5  # answered at the timeout, not the engine's end
    assert f"The {what} service took this request but did not answer within 1 seconds" \
        in response.json()["detail"]
    # The request carried its deadline (the engine takes work only before it), once.
    assert len(engine.requests) == 1
    assert 0 < int(engine.requests[0].headers["X-Anex-Timeout-Ms"]) <= 1000
    # and what the web tier counted is billed: the engine did that work
    usage = RealtimeUsage.objects.get()
    assert usage.input_tokens > 0
    assert f"({usage.input_tokens:,} input tokens)" in response.json()["detail"]


def test_an_engine_at_capacity_is_503_with_retry_after_and_bills_nothing(
        api: APIClient, engine: LocalServer, organization: Organization) -> None:
    engine.routes["/v1/embeddings"] = lambda handler: reply(
        handler, 503, b'{"detail": "the engine\'s queue is full (512 items waiting)"}',
        headers={"Retry-After": "1"})
    response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
    assert response.status_code == 503, response.content
    assert response["Retry-After"] == "1"
    assert "at capacity and did not take this request" in response.json()["detail"]
    assert not RealtimeUsage.objects.exists()
    assert slots_in_flight(organization_id=organization.pk) == 0


# -- the rate counted before the body is read (issue 22, L4) ------------------------------

def test_requests_that_fail_validation_count_against_the_keys_rate(
        organization: Organization, client_for: Callable[[str], APIClient],
        engine: LocalServer) -> None:
    _key, plaintext = api_key_make(organization, rate_limit_per_minute=2)
    client = client_for(plaintext)
    # given two refused requests of the key this minute
    assert client.post(EMBED, {"model": MINILM, "input": 7}, format="json").status_code == 422
    assert client.post(EMBED, {"model": MINILM, "input": [{"type": "x"}] * 200},
                       format="json").status_code == 400
    # when a valid one arrives, it is past the key's rate
    response = client.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
    assert response.status_code == 429, response.content
    assert response.json()["error"]["code"] == "rate_limit_exceeded"
    assert engine.requests == []


def test_the_number_of_inputs_is_checked_before_any_input(
        api: APIClient, engine: LocalServer) -> None:
    body = refused(api.post(EMBED, {"model": MINILM, "input": [{"type": "x"}] * 129},
                            format="json"), 400, engine)
    assert "input has 129 items, over the 128-input limit" in body["detail"]


# -- reservations: concurrent requests cannot overdraw (issue 23, item 2) -----------------

MAXIMAL_DECISION = {"model": "laya", "state": "We were billed twice for March. " * 1562,
                    "questions": {f"q{i}": QUESTIONS["urgent"] for i in range(64)}}


def held(server: LocalServer, arrived: threading.Semaphore,
         answer: Callable[[Any], None]) -> Callable[[Any], None]:
    """An engine route that holds each request until the server is released."""
    def route(handler: Any) -> None:
        arrived.release()
        server.release.wait(30)
        answer(handler)

    return route


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("holder", ["organization", "key"])
def test_64_concurrent_maximal_requests_on_one_credit_never_overdraw(
        settings: Settings, server: LocalServer, tokenizers: Path, holder: str,
        connections_many: None) -> None:
    from concurrent.futures import ThreadPoolExecutor

    from billing.unsettled import NANO_PER_CREDIT
    from realtime.concurrency import reservations_in_flight, unsettled_nano

    # given one credit to spend: the organization's only credit, or a key's budget of one
    settings.ANEX_FREE_GRANT_CENTS = 1 if holder == "organization" else 100
    settings.ANEX_REALTIME_ENGINES = {"laya": server.url("")}
    # All 64 in this one process at once: its own realtime cap is not what is tested here.
    settings.ANEX_REALTIME_PROCESS_CONCURRENCY = 64
    arrived = threading.Semaphore(0)
    server.routes["/v1/systemone"] = held(server, arrived, decision_answer)
    organization = organization_make()
    key, plaintext = api_key_make(organization, **(
        {"spend_budget_cents": 1} if holder == "key" else {}))
    start = ledger_total(organization)
    statuses: list[int] = []
    details: list[str] = []

    def call() -> None:
        client = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")
        response = client.post(DECIDE, MAXIMAL_DECISION, format="json")
        statuses.append(response.status_code)
        if response.status_code != 200:
            details.append(response.json()["detail"])
        connection.close()

    # when 64 maximal decisions (each most of a credit) arrive at once, the admitted ones
    # held in the engine until every other has been answered
    with ThreadPoolExecutor(64) as pool:
        futures = [pool.submit(call) for _ in range(64)]
        assert arrived.acquire(timeout=30)
        deadline = time.monotonic() + 60
        while len(statuses) < 64 - len(server.requests) and time.monotonic() < deadline:
            time.sleep(0.05)
        server.release.set()
        for future in futures:
            future.result(60)
    # then one credit's worth was admitted, every other refused 402 before the engine
    admitted = statuses.count(200)
    assert admitted == len(server.requests) == 1, statuses
    assert statuses.count(402) == 63, details[:3]
    words = "credits do not cover" if holder == "organization" else "budget does not cover"
    assert all(words in detail for detail in details), details[:2]
    usage = RealtimeUsage.objects.get()
    assert Decimal("0.005") < usage.cost_usd <= Decimal("0.01")
    # and once settled the ledger ends where the documented bound says: never below zero
    # (the organization), never past the budget (the key)
    realtime_charges_settle_all(settled_before=later())
    assert ledger_total(organization) >= (0 if holder == "organization" else start - 1)
    assert key_spend_cents(api_key=key) <= 1
    # and nothing is left held: no slot, no reservation, and the unsettled total is the
    # fraction of a credit the ledger carries
    assert slots_in_flight(organization_id=organization.pk) == 0
    assert reservations_in_flight(organization_id=organization.pk) == 0
    settlement = RealtimeSettlement.objects.get(api_key=key)
    assert unsettled_nano(organization_id=organization.pk) == (
        math.ceil(settlement.metered_usd * 10**9) - settlement.charged_cents * NANO_PER_CREDIT)


def test_a_reservation_is_held_while_its_request_runs_and_given_back_after(
        api: APIClient, engine: LocalServer, organization: Organization) -> None:
    from realtime.concurrency import reservations_in_flight

    seen: list[int] = []

    def watching(handler: Any) -> None:
        seen.append(reservations_in_flight(organization_id=organization.pk))
        vector_answer(handler)

    engine.routes["/v1/embeddings"] = watching
    assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200
    assert seen == [1]
    assert reservations_in_flight(organization_id=organization.pk) == 0


def test_past_the_unsettled_cap_realtime_is_503_until_the_settlement_catches_up(
        settings: Settings, api: APIClient, engine: LocalServer,
        organization: Organization, api_key: ApiKey) -> None:
    from anex.redis import redis_client
    from billing.unsettled import NANO_PER_CREDIT, metered_keys
    from realtime.concurrency import realtime_settled_add

    # given a balance of 100 credits, a cap of 1, and a credit's worth of usage unsettled
    settings.ANEX_REALTIME_UNSETTLED_CAP_CREDITS = 1
    for counter in metered_keys(organization.pk, api_key.pk):
        redis_client().incrby(counter, NANO_PER_CREDIT)
    response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
    body = refused(response, 503, engine)
    assert "has reached its cap of 1 credits" in body["detail"]
    assert response["Retry-After"] == "30"
    # when the settlement charges it, the next request is served
    realtime_settled_add(organization_id=organization.pk, key_id=api_key.pk,
                         amount=NANO_PER_CREDIT)
    realtime_credits_forget()
    assert api.post(EMBED, {"model": MINILM, "input": "x"}, format="json").status_code == 200


def test_without_redis_a_realtime_request_is_refused_503(
        settings: Settings, api: APIClient, engine: LocalServer) -> None:
    settings.REDIS_URL = f"redis://127.0.0.1:{free_port()}/0"
    response = api.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
    body = refused(response, 503, engine)
    assert "could not reserve this request's cost" in body["detail"]
    assert int(response["Retry-After"]) >= 1


# -- settlement: only unsettled rows, rolled up and purged (issue 23, item 2) -------------

def test_the_settlement_reads_only_unsettled_rows(organization: Organization,
                                                  api_key: ApiKey) -> None:
    from realtime.services.settlement import _SETTLE_SQL

    # given a key with 20,000 settled usage rows and a few unsettled ones
    old = timezone.now() - timedelta(hours=1)
    RealtimeUsage.objects.bulk_create(
        RealtimeUsage(organization=organization, api_key=api_key, endpoint=Endpoint.EMBEDDINGS,
                      model=MINILM, input_tokens=5, cost_usd=Decimal("1e-8"), settled=True)
        for _ in range(20_000))
    RealtimeUsage.objects.bulk_create(
        RealtimeUsage(organization=organization, api_key=api_key, endpoint=Endpoint.EMBEDDINGS,
                      model=MINILM, input_tokens=5, cost_usd=Decimal("1e-8"))
        for _ in range(5))
    RealtimeUsage.objects.update(created_at=old)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE realtime_realtimeusage")
        # when the sweep's two statements are planned
        keys = (RealtimeUsage.objects.filter(settled=False, created_at__lt=timezone.now())
                .order_by().values_list("api_key_id", flat=True).distinct())
        sweep = keys.explain()
        cursor.execute("EXPLAIN " + _SETTLE_SQL, [api_key.pk, timezone.now()])
        settle = "\n".join(row[0] for row in cursor.fetchall())
    # then both read the partial index of unsettled rows, never the table's settled rows
    for plan in (sweep, settle):
        assert "realtime_usage_unsettled" in plan, plan
        assert "Seq Scan" not in plan, plan
    assert "ORDER BY" not in str(keys.query)  # the default ordering no longer defeats DISTINCT
    assert realtime_charges_settle_all(settled_before=later()) == 0
    assert RealtimeUsage.objects.filter(settled=False).count() == 0


def test_settled_usage_is_rolled_up_by_day_and_purged_after_its_retention(
        organization: Organization, api_key: ApiKey) -> None:
    from realtime.models import RealtimeUsageDaily
    from realtime.services.settlement import realtime_settlement_lag_seconds, realtime_usage_purge

    model = model_get(MINILM)
    assert model is not None
    for tokens in (1_000_000, 2_000_000):
        realtime_usage_record(key=api_key, endpoint=Endpoint.EMBEDDINGS, model=model,
                              input_tokens=tokens)
    assert realtime_settlement_lag_seconds() >= 0
    start = ledger_total(organization)
    realtime_charges_settle(key=api_key, settled_before=later())
    daily = RealtimeUsageDaily.objects.get()
    assert (daily.api_key_id, daily.endpoint, daily.model, daily.requests,
            daily.input_tokens) == (api_key.pk, Endpoint.EMBEDDINGS, MINILM, 2, 3_000_000)
    assert daily.cost_usd == Decimal("0.006")
    assert realtime_settlement_lag_seconds() == 0
    # A row used after the settlement stays unsettled, and is never purged.
    realtime_usage_record(key=api_key, endpoint=Endpoint.EMBEDDINGS, model=model,
                          input_tokens=5)
    assert realtime_usage_purge(before=later()) == 2
    assert list(RealtimeUsage.objects.values_list("settled", flat=True)) == [False]
    assert ledger_total(organization) == start - 0  # 0.6 of a credit: carried, not charged
    assert RealtimeUsageDaily.objects.get().requests == 2


def test_the_settlement_runs_on_a_queue_of_its_own() -> None:
    from realtime.tasks import realtime_charges_settle_task

    assert realtime_charges_settle_task.queue_name == "realtime"


# -- the web tier keeps answering while realtime is slow (issue 23, item 4) ---------------

@pytest.mark.django_db(transaction=True)
def test_past_the_process_cap_realtime_is_503_and_the_batch_api_still_answers(
        settings: Settings, server: LocalServer) -> None:
    from concurrent.futures import ThreadPoolExecutor

    settings.ANEX_REALTIME_PROCESS_CONCURRENCY = 1
    settings.ANEX_REALTIME_ENGINES = {MINILM: server.url("")}
    arrived = threading.Semaphore(0)
    server.routes["/v1/embeddings"] = held(server, arrived, vector_answer)
    _key, plaintext = api_key_make(organization_make())
    client = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}")

    def embed() -> int:
        status = APIClient(HTTP_AUTHORIZATION=f"Bearer {plaintext}").post(
            EMBED, {"model": MINILM, "input": "x"}, format="json").status_code
        connection.close()
        return status

    # given a request held by a slow engine, this process's one realtime place
    with ThreadPoolExecutor(1) as pool:
        first = pool.submit(embed)
        try:
            assert arrived.acquire(timeout=30)
            # when another realtime request arrives, it is refused at once
            response = client.post(EMBED, {"model": MINILM, "input": "x"}, format="json")
            assert response.status_code == 503, response.content
            assert response["Retry-After"] == "1"
            assert "as many realtime requests as it may at once" in response.json()["detail"]
            # before the key, the rate or the body is read: no query, and a bad key's
            # request is refused alike
            with CaptureQueriesContext(connection) as queries:
                unknown = APIClient(HTTP_AUTHORIZATION="Bearer sk_unknown").post(
                    DECIDE, {"model": "laya"}, format="json")
            assert (unknown.status_code, unknown["Retry-After"]) == (503, "1")
            assert len(queries) == 0, [q["sql"] for q in queries]
            # and the batch API and /healthz answer meanwhile
            assert client.get("/batch/v1/jobs/job_unknown").status_code == 404
            assert client.get(MODELS).status_code == 200
            assert Client().get("/healthz").status_code == 200
        finally:
            server.release.set()
        statuses = [first.result(30)]
    assert statuses == [200]
    assert RealtimeUsage.objects.count() == 1


def test_the_settlement_lag_is_shown_to_staff(organization: Organization,
                                              api_key: ApiKey) -> None:
    model = model_get(MINILM)
    assert model is not None
    realtime_usage_record(key=api_key, endpoint=Endpoint.EMBEDDINGS, model=model,
                          input_tokens=5)
    RealtimeUsage.objects.update(created_at=timezone.now() - timedelta(seconds=90))
    staff = Client()
    staff.force_login(get_user_model().objects.create_superuser(
        "staff", "staff@example.com", "pw-staff-1"))
    page = staff.get("/admin/realtime/realtimeusage/").content.decode()
    assert "Realtime usage (settlement lag: 9" in page  # 90 s and the test's own seconds
    assert staff.get("/admin/realtime/realtimeusagedaily/").status_code == 200


# -- the official OpenAI client, unchanged ------------------------------------------------

@pytest.mark.django_db(transaction=True)
def test_the_openai_client_lists_and_embeds_with_and_without_encoding_format(
        settings: Settings, server: LocalServer, live_server: Any) -> None:
    from openai import OpenAI

    settings.ANEX_REALTIME_ENGINES = {MINILM: server.url(""), "laya": server.url("")}
    server.routes["/v1/embeddings"] = vector_answer
    _key, plaintext = api_key_make(organization_make())
    client = OpenAI(base_url=f"{live_server.url}/realtime/v1", api_key=plaintext)
    assert {MINILM, "laya"} <= {model.id for model in client.models.list()}
    unit = [1.0] + [0.0] * 383
    # The SDK's default call: it asks for base64 and decodes it to floats.
    assert client.embeddings.create(model=MINILM, input="a query").data[0].embedding == unit
    assert json.loads(server.requests[-1].body)["input"] == ["a query"]
    floats = client.embeddings.create(model=MINILM, input=["a", "b"], encoding_format="float")
    assert [item.embedding for item in floats.data] == [unit, unit]
    # A caller who asks for base64 gets the string, as OpenAI sends it.
    asked = client.embeddings.create(model=MINILM, input="a query", encoding_format="base64")
    encoded = asked.data[0].embedding
    assert isinstance(encoded, str)
    raw = base64.b64decode(encoded)
    assert list(struct.unpack(f"<{len(raw) // 4}f", raw)) == unit
    assert RealtimeUsage.objects.count() == 3
