"""Issue 11, item 10: request bodies on /batch/ and /realtime/ are bounded. A body declared
over the limit is answered 413 in the API's envelope before a byte of it is read, and the
server keeps answering other requests meanwhile."""

from __future__ import annotations

import http.client
import io
import socket
from typing import Any

import pytest
from django.test import Client
from pytest_django import Settings
from rest_framework.test import APIClient

from anex.api.bodylimit import body_limit, body_too_large_detail
from jobs.models import Job

HUGE = 10 * 1024 ** 3  # 10 GiB declared


class CountingStream(io.RawIOBase):
    """A request body that never ends and counts what the application read of it."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        size = len(buffer)
        buffer[:size] = b"a" * size
        self.read_bytes += size
        return size

    def readline(self, size: int | None = -1) -> bytes:
        chunk = b"a" * (size if size and size > 0 else 65536)
        self.read_bytes += len(chunk)
        return chunk


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/batch/v1/jobs", "/batch/v1/inputs",
                                  "/realtime/v1/embeddings", "/realtime/v1/systemone"])
def test_an_oversized_body_is_413_without_being_read(api: APIClient, path: str) -> None:
    stream = CountingStream()
    environ: dict[str, Any] = {"CONTENT_LENGTH": str(HUGE), "wsgi.input": stream}
    response = api.post(path, content_type="application/json", **environ)
    assert response.status_code == 413
    # Each endpoint's own cap (anex/api/bodylimit.py): realtime embeddings take up to
    # 2,097,152 characters (400 past it), an input's few fields far less than a submit's.
    limit = body_limit(path).bytes
    assert response.json() == {"detail": body_too_large_detail(HUGE, limit)}
    assert response["Content-Type"] == "application/json"
    assert response.has_header("X-Anex-Request-ID")
    assert stream.read_bytes == 0
    assert not Job.objects.exists()


@pytest.mark.django_db
def test_the_limit_holds_before_the_key_is_checked(settings: Settings) -> None:
    # Nothing about the request is judged by reading its body: an unauthenticated client
    # gets the same 413, so it cannot make us buffer anything either.
    stream = CountingStream()
    environ: dict[str, Any] = {"CONTENT_LENGTH": str(HUGE), "wsgi.input": stream}
    response = Client().post("/batch/v1/jobs", content_type="application/json", **environ)
    assert response.status_code == 413
    assert stream.read_bytes == 0


@pytest.mark.django_db
def test_a_body_just_over_a_lowered_limit_is_413_and_one_under_it_is_read(
        api: APIClient, settings: Settings) -> None:
    settings.ANEX_API_MAX_BODY_BYTES = 2048
    padded = {"model": "laya", "input_id": "x" * 3000}
    response = api.post("/batch/v1/jobs", padded, format="json")
    assert response.status_code == 413
    assert response.json()["detail"].startswith("The request body is ")
    small = api.post("/batch/v1/jobs", {"model": "laya"}, format="json")
    assert small.status_code != 413


@pytest.mark.django_db
def test_other_paths_keep_their_own_rules(client: Client, settings: Settings) -> None:
    settings.ANEX_API_MAX_BODY_BYTES = 65536
    # Not under /batch/ or /realtime/: this middleware does not answer it.
    response = client.post("/docs/", data=b"x" * 100_000, content_type="text/plain")
    assert response.status_code != 413


@pytest.mark.django_db(transaction=True)
def test_over_a_socket_the_413_comes_before_the_body(live_server: Any) -> None:
    # given a client that declares 10 GiB and sends almost none of it
    host, port = live_server.url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as attacker:
        attacker.sendall(
            b"POST /batch/v1/jobs HTTP/1.1\r\nHost: localhost\r\n"
            b"Content-Type: application/json\r\n"
            + f"Content-Length: {HUGE}\r\n\r\n".encode() + b'{"model": ')
        # when the server answers, it has not waited for (or read) the rest
        status_line = attacker.recv(65536).split(b"\r\n", 1)[0]
        assert b" 413 " in status_line
        # then, with the attacker still connected, another client is served at once
        other = http.client.HTTPConnection(host, int(port), timeout=10)
        other.request("GET", "/batch/v1/jobs")
        assert other.getresponse().status == 422  # answered (no key), not stuck
        other.close()
