"""Issue 40: a NUL character in an id or a cursor answered 500 on the OpenAI surface
(psycopg's DataError: PostgreSQL's text holds no NUL). Every URL pattern of every surface -
the batch API, realtime, the OpenAI surface, the console, the admin, the docs and storage -
is sent a NUL in each of its path values and in a query parameter, by each method, signed
in as it needs: none answers 500; the path is a 404, the query a 400 naming the parameter,
each in its surface's envelope (anex/api/nul.py)."""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import pytest
from django.test import Client
from django.urls import URLPattern, URLResolver, get_resolver
from rest_framework.test import APIClient

from anex.api.nul import nul_query_detail
from console.models import Organization
from openai_api.models import OpenAIBatch
from tests.db.test_console import signed_in
from tests.factories import chat_request_line

pytestmark = pytest.mark.django_db
NUL = "a%00b"
# A path value of each converter, where the value is not the one under test.
SAMPLES = {"uuid": "5b0c5bd8-30fa-4b8b-a3b1-7d9f3bb0a0a1", "int": "1", "path": "x",
           "str": "x", "slug": "x"}
# <converter:name>, or a regular expression's named group (allauth, the docs pages).
PARAMETER = re.compile(r"<(?:(?P<converter>\w+):)?(?P<name>\w+)>|\(\?P<(?P<group>\w+)>[^)]*\)\??")
# Cursors, filters and searches the views read, sent with a NUL each.
QUERY_NAMES = ("after", "purpose", "order", "limit", "merged", "q", "page", "status", "next")


def routes(resolver: URLResolver | None = None, prefix: str = "") -> Iterator[str]:
    for pattern in (resolver or get_resolver()).url_patterns:
        if isinstance(pattern, URLResolver):
            yield from routes(pattern, prefix + str(pattern.pattern))
        else:
            assert isinstance(pattern, URLPattern)
            yield prefix + str(pattern.pattern)


def concrete(route: str, nul_at: int | None) -> str:
    """The route as a path: its `nul_at`-th value a NUL, the others samples."""
    index = -1

    def value(match: re.Match[str]) -> str:
        nonlocal index
        index += 1
        if index == nul_at:
            return NUL
        return SAMPLES.get(match.group("converter") or "str", "x")

    return "/" + PARAMETER.sub(value, route).replace("^", "").replace("$", "")


def requests() -> Iterator[tuple[str, str]]:
    """(route, path) for each path value of each route, and each route with none."""
    for route in routes():
        count = len(PARAMETER.findall(route))
        for at in range(count):
            yield route, concrete(route, at)
        yield route, concrete(route, None)


@pytest.fixture
def staff(admin_user: Any) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def test_no_url_with_a_nul_answers_500_anywhere(api: APIClient, organization: Organization,
                                                staff: Client) -> None:
    console, _user = signed_in(organization)
    seen = 0
    for route, path in requests():
        client: Any = (api if path.startswith(("/batch/", "/realtime/", "/openai/"))
                       else staff if path.startswith("/admin/") else console)
        if "%00" in path:  # a path value
            for method in ("get", "post", "delete"):
                response = getattr(client, method)(path)
                assert response.status_code == 404, f"{method} {path} ({route})"
                seen += 1
        else:  # each query parameter a view may read, alone
            for name in QUERY_NAMES:
                response = client.get(f"{path}?{name}={NUL}")
                assert response.status_code == 400, f"GET {path}?{name}={NUL} ({route})"
                seen += 1
    assert seen > 1000


@pytest.mark.parametrize("url", ["/openai/v1/files/a%00b", "/openai/v1/files/a%00b/content",
                                 "/openai/v1/batches/a%00b", "/openai/v1/batches/a%00b/cancel"])
def test_an_openai_id_with_a_nul_is_openais_404(api: APIClient, url: str) -> None:
    for method in ("get", "post", "delete"):
        response = getattr(api, method)(url)
        assert response.status_code == 404
        assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize("url,name", [("/openai/v1/batches?after=a%00b", "after"),
                                      ("/openai/v1/files?after=a%00b", "after"),
                                      ("/openai/v1/files?purpose=batch%00", "purpose")])
def test_an_openai_cursor_with_a_nul_is_openais_400_naming_it(api: APIClient, url: str,
                                                              name: str) -> None:
    response = api.get(url)
    assert (response.status_code, response.json()) == (400, {"error": {
        "message": nul_query_detail(name), "type": "invalid_request_error", "code": None,
        "param": name}})


def test_the_batch_api_answers_its_own_envelope(api: APIClient) -> None:
    assert api.get("/batch/v1/jobs/a%00b").json() == {"detail": "Not found."}
    response = api.get("/batch/v1/jobs/5b0c5bd8-30fa-4b8b-a3b1-7d9f3bb0a0a1/result"
                       "?merged=tr%00ue")
    assert (response.status_code, response.json()) == (
        400, {"detail": nul_query_detail("merged")})


def test_a_page_with_a_nul_is_the_html_404(organization: Organization) -> None:
    console, _user = signed_in(organization)
    response = console.get("/console/invitations/a%00b")
    assert response.status_code == 404
    assert response["Content-Type"].startswith("text/html")


def test_a_nul_in_an_openai_batchs_metadata_key_is_400_not_500(api: APIClient) -> None:
    # The same NUL in a body: a metadata key is kept as given in jsonb, which holds none.
    uploaded = api.post("/openai/v1/files", {"purpose": "batch", "file": io.BytesIO(
        chat_request_line("r1"))}, format="multipart")
    assert uploaded.status_code == 200, uploaded.content
    response = api.post("/openai/v1/batches", {
        "input_file_id": uploaded.json()["id"], "endpoint": "/v1/chat/completions",
        "completion_window": "24h", "metadata": {"a\x00": "x"}}, format="json")
    assert (response.status_code, response.json()["error"]["param"]) == (400, "metadata")
    assert not OpenAIBatch.objects.exists()
