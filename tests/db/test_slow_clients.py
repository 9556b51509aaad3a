"""Slow clients and the web tier's threads (issue 40 M2; the real gunicorn role's socket
timeouts: tests/e2e/test_slow_clients.py).

- A realtime request reads its whole body before it takes one of the process's realtime
  places, so a client that stalls mid-body holds a thread, never a place.
- File transfers the web tier streams itself (OpenAI uploads and content, the local
  storage's upload form and download links) take a place first: past the organization's
  cap 429, past the process's 503, both with Retry-After, each in its surface's envelope;
  a streamed download gives its places back when the response is closed."""

from __future__ import annotations

import io
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from django.test import Client
from pytest_django import Settings

from anex import transfers
from anex.transfers import DOWNLOAD, UPLOAD, transfer_held, transfers_in_process
from console.models import ApiKey, Organization
from jobs.storage import storage_for
from realtime.services import admission as realtime_services
from tests.factories import api_key_make, organization_make
from tests.servers import LocalServer, reply

pytestmark = pytest.mark.django_db
EMBED = "/realtime/v1/embeddings"
MINILM = "all-minilm-l6-v2"
FILES = "/openai/v1/files"
WAIT = 30  # seconds: generous, nothing here waits that long unless it is broken


class Stalled(io.RawIOBase):
    """A request body whose client stopped sending: each read waits for `released` (or
    the web role's timeout, here the test's), then fails as a socket that timed out does.
    What it saw when first read is kept."""

    def __init__(self, *, on_read: Callable[[], Any] = lambda: None) -> None:
        self.released = threading.Event()
        self.reading = threading.Event()
        self.seen: list[Any] = []
        self._on_read = on_read

    def read(self, size: int | None = -1) -> bytes:
        self.seen.append(self._on_read())
        self.reading.set()
        self.released.wait(WAIT)
        raise TimeoutError("the client stopped sending")

    readline = read


@pytest.fixture(autouse=True)
def no_transfers_left() -> Iterator[None]:
    yield
    assert transfers_in_process() == 0


@pytest.fixture
def engine(settings: Settings, server: LocalServer) -> LocalServer:
    def vectors(handler: Any) -> None:
        reply(handler, body=b'{"data": [{"embedding": [1.0], "prompt_tokens": 3}]}')

    server.routes["/v1/embeddings"] = vectors
    settings.ANEX_REALTIME_ENGINES = {MINILM: server.url("")}
    return server


@pytest.mark.django_db(transaction=True)
def test_a_stalled_realtime_body_holds_no_realtime_place(
        settings: Settings, engine: LocalServer) -> None:
    # given a process with one realtime place, and a customer's client (a valid key) that
    # sends its headers and then nothing of its body
    settings.ANEX_REALTIME_PROCESS_CONCURRENCY = 1
    _key, plaintext = api_key_make(organization_make())
    body = Stalled(on_read=lambda: realtime_services._in_process)
    answers: list[Any] = []
    extra: dict[str, Any] = {"wsgi.input": body, "CONTENT_LENGTH": "4096",
                             "HTTP_AUTHORIZATION": f"Bearer {plaintext}"}
    stalled = threading.Thread(target=lambda: answers.append(Client().post(
        EMBED, data=b"{}", content_type="application/json", **extra)))
    stalled.start()
    try:
        assert body.reading.wait(WAIT)
        # when another client's request comes while that body is awaited
        served = Client().post(EMBED, {"model": MINILM, "input": "a query"},
                               content_type="application/json",
                               HTTP_AUTHORIZATION=f"Bearer {plaintext}")
    finally:
        body.released.set()
        stalled.join(WAIT)
    # then it is answered: the stalled body held no place (it was read before one is taken)
    assert served.status_code == 200, served.content
    assert body.seen == [0]
    # and the stalled one is 408 once its read fails, its place never taken
    assert answers[0].status_code == 408
    assert "did not arrive in time" in answers[0].json()["detail"]
    assert realtime_services._in_process == 0


def upload_form(purpose: str = "batch") -> tuple[bytes, str]:
    boundary = "anexboundary"
    body = (f"--{boundary}\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\n"
            f"{purpose}\r\n--{boundary}\r\nContent-Disposition: form-data; name=\"file\"; "
            f"filename=\"rows.jsonl\"\r\nContent-Type: application/jsonl\r\n\r\n"
            '{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", '
            '"body": {"model": "qwen3-embedding-8b", "input": "hi"}}\n'
            f"\r\n--{boundary}--\r\n").encode()
    return body, f"multipart/form-data; boundary={boundary}"


def upload(plaintext: str, stream: Any = None) -> Any:
    body, content_type = upload_form()
    extra: dict[str, Any] = {"wsgi.input": stream, "CONTENT_LENGTH": str(len(body))} \
        if stream else {}
    return Client().post(FILES, data=body, content_type=content_type,
                         HTTP_AUTHORIZATION=f"Bearer {plaintext}", **extra)


@pytest.mark.django_db(transaction=True)
def test_the_uploads_past_an_organizations_cap_are_429(settings: Settings) -> None:
    # given an organization with two uploads in progress whose clients send slowly
    settings.ANEX_ORG_TRANSFERS_IN_FLIGHT = 2
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    slow = [Stalled(), Stalled()]
    threads = [threading.Thread(target=upload, args=(plaintext, stream)) for stream in slow]
    for thread in threads:
        thread.start()
    try:
        assert all(stream.reading.wait(WAIT) for stream in slow)
        # when it starts a third
        third = upload(plaintext)
        # then it is refused before a byte is read, in OpenAI's envelope, with Retry-After
        assert third.status_code == 429, third.content
        assert int(third["Retry-After"]) >= 1
        error = third.json()["error"]
        assert "this organization already has 2 uploads in progress" in error["message"]
        assert error["type"] == "requests"
        # while another organization uploads
        _other, other_plaintext = api_key_make(organization_make())
        assert upload(other_plaintext).status_code == 200
    finally:
        for stream in slow:
            stream.released.set()
        for thread in threads:
            thread.join(WAIT)
    # and once they end, its places are free again
    assert upload(plaintext).status_code == 200


def test_a_full_process_refuses_a_transfer_with_503(settings: Settings, api_key: ApiKey,
                                                     key_pair: tuple[ApiKey, str]) -> None:
    settings.ANEX_WEB_TRANSFERS_PER_PROCESS = 1
    with transfer_held(direction=DOWNLOAD, organization_id="another-organization"):
        refused = upload(key_pair[1])
    assert refused.status_code == 503, refused.content
    assert int(refused["Retry-After"]) >= 1
    assert "streaming as many file transfers" in refused.json()["error"]["message"]


def test_a_downloads_places_are_held_until_its_response_is_closed(
        settings: Settings, key_pair: tuple[ApiKey, str], organization: Organization) -> None:
    settings.ANEX_ORG_TRANSFERS_IN_FLIGHT = 1
    uploaded = upload(key_pair[1])
    assert uploaded.status_code == 200, uploaded.content
    content = f"{FILES}/{uploaded.json()['id']}/content"
    auth: dict[str, Any] = {"HTTP_AUTHORIZATION": f"Bearer {key_pair[1]}"}
    # given one download of the organization's still streaming (its response not closed)
    streaming = Client().get(content, **auth)
    assert streaming.status_code == 200
    assert transfers_in_process() == 1
    # then a second is refused
    second = Client().get(content, **auth)
    assert second.status_code == 429
    assert "already has 1 downloads in progress" in second.json()["error"]["message"]
    # and once the first is read to its end (the test client closes it then), its places
    # are back
    assert b"custom_id" in b"".join(streaming.streaming_content)  # type: ignore[attr-defined]
    assert transfers_in_process() == 0
    again = Client().get(content, **auth)
    assert again.status_code == 200, again.content
    assert b"".join(again.streaming_content)  # type: ignore[attr-defined]


def test_a_download_read_to_its_end_gives_its_places_back_unclosed() -> None:
    # A WSGI client that reads a response to its end and never closes it (Schemathesis'
    # in-process calls did: after four such downloads every transfer was a 503).
    places = transfers.transfer_places_take(direction=DOWNLOAD, organization_id="org-read")
    stream = transfers.TransferStream(iter([b"a", b"b"]), places)
    assert transfers_in_process() == 1
    assert b"".join(stream) == b"ab"
    assert transfers_in_process() == 0
    stream.close()  # and a close after it gives back nothing twice
    assert transfers_in_process() == 0


def test_the_local_storage_caps_its_downloads_as_s3_says_it(
        settings: Settings, tmp_path: Any) -> None:
    settings.ANEX_STORAGE_BACKEND, settings.ANEX_STORAGE_ROOT = "local", tmp_path
    settings.ANEX_ORG_TRANSFERS_IN_FLIGHT = 1
    storage = storage_for("world")
    key = "results/org-1/job/out.jsonl"
    storage.write_stream(key, iter([b"a line\n"]), max_bytes=100)
    link = storage.download_url(key, expires_in=300, filename="out.jsonl")
    path = link.split("://", 1)[1].split("/", 1)[1]
    with transfer_held(direction=DOWNLOAD, organization_id="org-1"):
        refused = Client().get(f"/{path}")
        other_direction_ok = transfers.transfer_places_take(direction=UPLOAD,
                                                            organization_id="org-1")
        other_direction_ok.release()
    assert refused.status_code == 429
    assert refused.json()["detail"].startswith("SlowDown: Too many downloads at once")
    assert int(refused["Retry-After"]) >= 1
    served = Client().get(f"/{path}")
    assert served.status_code == 200
    assert b"".join(served.streaming_content) == b"a line\n"  # type: ignore[attr-defined]


def test_a_long_transfer_keeps_its_organization_place_and_a_dead_ones_lapses() -> None:
    from anex.redis import redis_client

    # given an upload that has run for a while, its place about to lapse
    places = transfers.transfer_places_take(direction=UPLOAD, organization_id="org-long")
    client = redis_client()
    assert places.token is not None
    client.zadd(places.key, {places.token: 1.0})  # long past, as if never pushed on
    # when the process's keeper makes its round, the place is pushed on while it is held
    transfers.places_refresh()
    assert float(client.zscore(places.key, places.token) or 0) > 1000.0
    # and once given back, no round makes it again
    places.release()
    transfers.places_refresh()
    assert client.zscore(places.key, places.token) is None
