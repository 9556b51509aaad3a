"""The realtime API's lean middleware path (anex.internals.lean): /realtime/v1/ skips the
browser's middlewares and answers exactly what the full stack answers, and every other
path keeps the full stack."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.contrib.sessions.middleware import SessionMiddleware
from django.core.exceptions import ImproperlyConfigured
from django.middleware.csrf import CsrfViewMiddleware
from django.test import Client
from pytest_django import Settings

from anex.internals.lean import BROWSER_ONLY, THIS, lean_middleware
from console.models import ApiKey, Organization
from realtime.models import RealtimeUsage
from realtime.selectors import realtime_frozen_forget
from realtime.services.admission import realtime_credits_forget
from tests.factories import api_key_make
from tests.servers import LocalServer, reply

pytestmark = pytest.mark.django_db
EMBED, DECIDE, MODELS = ("/realtime/v1/embeddings", "/realtime/v1/systemone",
                         "/realtime/v1/models")
MINILM = "all-minilm-l6-v2"
EMBEDDING = {"model": MINILM, "input": ["a query", "another"]}
DECISION = {"model": "laya", "state": "We were billed twice.",
            "questions": {"urgent": {"type": "noul", "instructions": "Is it urgent?"}}}
REQUEST_ID = re.compile(r"req_[0-9a-f]{32}")


def _vectors(handler: Any) -> None:
    sent = json.loads(handler.server.owner.requests[-1].body)
    reply(handler, body=json.dumps({"data": [
        {"embedding": [0.6, 0.8] + [0.0] * 382, "prompt_tokens": 4} for _ in sent["input"]]}
    ).encode())


def _decision(handler: Any) -> None:
    reply(handler, body=json.dumps({
        "answers": {"urgent": {"type": "noul", "noul": 0.9, "confidence": 0.9,
                               "answer_confidence": 0.9}},
        "input_tokens": 11, "routing": {"model": "english", "reason": "Latin"}}).encode())


@pytest.fixture(autouse=True)
def engine(settings: Settings, server: LocalServer) -> Iterator[LocalServer]:
    server.routes["/v1/embeddings"] = _vectors
    server.routes["/v1/systemone"] = _decision
    settings.ANEX_REALTIME_ENGINES = {MINILM: (server.url(""),), "laya": (server.url(""),)}
    realtime_frozen_forget()
    realtime_credits_forget()
    yield server
    realtime_frozen_forget()


@pytest.fixture
def full_stack(settings: Settings) -> Callable[[], Client]:
    """A client whose handler is built without the lean middleware: the full stack."""
    lean = list(settings.MIDDLEWARE)

    def make() -> Client:
        settings.MIDDLEWARE = [path for path in lean if path != THIS]
        try:
            client = Client()
            client.get("/healthz")  # the handler loads its middleware on its first request
            return client
        finally:
            settings.MIDDLEWARE = lean
    return make


def _send(client: Client, method: str, path: str, body: Any, **headers: str) -> Any:
    if method == "GET":
        return client.get(path, headers=headers)
    data = body if isinstance(body, str) else json.dumps(body)
    return client.generic(method, path, data.encode(), content_type="application/json",
                          headers=headers)


def _same_answer(lean: Any, full: Any) -> None:
    """Status, body and every header the same; the request ids each well formed."""
    assert lean.status_code == full.status_code, (lean.content, full.content)
    assert lean.content == full.content
    lean_headers = {name: value for name, value in lean.headers.items()
                    if name != "X-Anex-Request-ID"}
    full_headers = {name: value for name, value in full.headers.items()
                    if name != "X-Anex-Request-ID"}
    assert list(lean_headers.items()) == list(full_headers.items())
    assert REQUEST_ID.fullmatch(lean["X-Anex-Request-ID"])
    assert REQUEST_ID.fullmatch(full["X-Anex-Request-ID"])


def _key(organization: Organization, **options: Any) -> str:
    return api_key_make(organization, **options)[1]


CASES: list[tuple[str, str, str, Any, Callable[[str], dict[str, str]]]] = [
    ("an embedding", "POST", EMBED, EMBEDDING, lambda k: {"Authorization": f"Bearer {k}"}),
    ("a decision", "POST", DECIDE, DECISION, lambda k: {"x-api-key": k}),
    ("the model list", "GET", MODELS, None, lambda k: {"Authorization": f"Bearer {k}"}),
    ("a bad key", "POST", EMBED, EMBEDDING,
     lambda k: {"Authorization": "Bearer sk-abcdefghijkl_" + "a" * 40}),
    ("no key", "POST", EMBED, EMBEDDING, lambda k: {}),
    ("not JSON", "POST", EMBED, "{not json", lambda k: {"Authorization": f"Bearer {k}"}),
    ("a malformed body", "POST", EMBED, {"model": MINILM},
     lambda k: {"Authorization": f"Bearer {k}"}),
    ("an unknown model", "POST", EMBED, {"model": "nope", "input": "x"},
     lambda k: {"Authorization": f"Bearer {k}"}),
    ("a wrong method", "GET", EMBED, None, lambda k: {"Authorization": f"Bearer {k}"}),
    ("an OPTIONS request", "OPTIONS", DECIDE, {}, lambda k: {"Authorization": f"Bearer {k}"}),
    ("no such URL", "POST", "/realtime/v1/nothing", {}, lambda k: {}),
    ("an unacceptable Accept", "POST", EMBED, EMBEDDING,
     lambda k: {"Authorization": f"Bearer {k}", "Accept": "text/html"}),
    ("a caller's request id", "POST", EMBED, EMBEDDING,
     lambda k: {"Authorization": f"Bearer {k}", "X-Request-ID": "trace-1"}),
]


@pytest.mark.parametrize(("case", "method", "path", "body", "headers"), CASES,
                         ids=[case[0] for case in CASES])
def test_the_lean_path_answers_what_the_full_stack_answers(
        organization: Organization, full_stack: Callable[[], Client], case: str,
        method: str, path: str, body: Any, headers: Callable[[str], dict[str, str]]) -> None:
    # given one key per side (each side's rate counted alone)
    lean_key, full_key = _key(organization), _key(organization)
    # when each side is sent the same request
    lean = _send(Client(), method, path, body, **headers(lean_key))
    full = _send(full_stack(), method, path, body, **headers(full_key))
    # then the answers are the same, byte for byte and header for header
    _same_answer(lean, full)


def test_a_rate_limited_request_is_answered_alike_with_retry_after(
        organization: Organization, full_stack: Callable[[], Client]) -> None:
    lean_key = _key(organization, rate_limit_per_minute=1)
    full_key = _key(organization, rate_limit_per_minute=1)
    answers = []
    for client, key in ((Client(), lean_key), (full_stack(), full_key)):
        _send(client, "POST", EMBED, EMBEDDING, Authorization=f"Bearer {key}")
        answers.append(_send(client, "POST", EMBED, EMBEDDING, Authorization=f"Bearer {key}"))
    lean, full = answers
    assert lean.status_code == 429 and int(lean["Retry-After"]) >= 1
    # the seconds left in the window may differ by the one that passed between them
    assert abs(int(lean["Retry-After"]) - int(full["Retry-After"])) <= 1
    full.headers["Retry-After"] = lean["Retry-After"]
    _same_answer(lean, full)


def test_an_unhandled_error_is_the_same_500_envelope(
        organization: Organization, full_stack: Callable[[], Client],
        monkeypatch: pytest.MonkeyPatch) -> None:
    def broken(**kwargs: Any) -> dict[str, Any]:
        raise RuntimeError("a bug")

    monkeypatch.setattr("realtime.api.realtime_embeddings_create", broken)
    lean = _send(Client(), "POST", EMBED, EMBEDDING,
                 Authorization=f"Bearer {_key(organization)}")
    full = _send(full_stack(), "POST", EMBED, EMBEDDING,
                 Authorization=f"Bearer {_key(organization)}")
    assert lean.status_code == 500
    _same_answer(lean, full)


def test_the_lean_path_bills_under_its_request_id(organization: Organization) -> None:
    key = _key(organization)
    response = _send(Client(), "POST", EMBED, EMBEDDING, Authorization=f"Bearer {key}")
    assert response.status_code == 200
    usage = RealtimeUsage.objects.get()
    assert usage.request_id == response["X-Anex-Request-ID"]
    assert usage.input_tokens == 8


@pytest.fixture
def browser_middleware_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The paths the session and CSRF middlewares saw (patched before a client loads them)."""
    seen: list[str] = []
    session_request = SessionMiddleware.process_request
    csrf_view = CsrfViewMiddleware.process_view

    def session(self: SessionMiddleware, request: Any) -> None:
        seen.append(request.path)
        session_request(self, request)

    def csrf(self: CsrfViewMiddleware, request: Any, *args: Any) -> Any:
        seen.append(request.path)
        return csrf_view(self, request, *args)

    monkeypatch.setattr(SessionMiddleware, "process_request", session)
    monkeypatch.setattr(CsrfViewMiddleware, "process_view", csrf)
    return seen


def test_realtime_skips_the_browser_middlewares_and_the_rest_keep_them(
        key_pair: tuple[ApiKey, str], browser_middleware_calls: list[str]) -> None:
    client = Client()
    auth = {"Authorization": f"Bearer {key_pair[1]}"}
    assert _send(client, "POST", EMBED, EMBEDDING, **auth).status_code == 200
    assert _send(client, "GET", MODELS, None, **auth).status_code == 200
    assert browser_middleware_calls == []
    # the batch API, the console, the health check and a page keep the full stack
    batch = client.get("/batch/v1/jobs/job_nope", headers=auth)
    console = client.get("/console/")
    assert batch.status_code == 404 and console.status_code == 302
    client.get("/healthz")
    assert browser_middleware_calls.count("/batch/v1/jobs/job_nope") == 2  # session, CSRF
    assert browser_middleware_calls.count("/console/") == 2
    assert "/healthz" in browser_middleware_calls


def test_the_lean_chain_is_the_settings_rest_less_the_browsers(settings: Settings) -> None:
    middleware = list(settings.MIDDLEWARE)
    lean = lean_middleware(middleware)
    after = middleware[middleware.index(THIS) + 1:]
    assert lean == [path for path in after if path not in BROWSER_ONLY]
    # what can change an API answer is kept, in its order
    assert lean == ["django.middleware.security.SecurityMiddleware",
                    "anex.csp.ContentSecurityPolicyMiddleware",
                    "anex.api.nul.NulRefusalMiddleware",
                    "django.middleware.common.CommonMiddleware",
                    "django.middleware.clickjacking.XFrameOptionsMiddleware"]
    # and the request id, the metrics and the body limit run before it, for every path
    assert middleware.index(THIS) > max(
        middleware.index("anex.metrics.RequestMetricsMiddleware"),
        middleware.index("anex.requestid.RequestIdMiddleware"),
        middleware.index("anex.api.bodylimit.ApiBodyLimitMiddleware"))
    with pytest.raises(ImproperlyConfigured):
        lean_middleware([path for path in middleware if path != THIS])
