"""Slow clients against the real web role (issue 40 M2): gunicorn's threads used to wait
without a bound once a request's first bytes had come, so a client that sent part of its
headers or body and stopped held a thread for good, and two such clients held a process of
two threads. The role's worker bounds every read (ANEX_WEB_SOCKET_TIMEOUT_SECONDS) and a
JSON body's whole arrival (ANEX_API_BODY_SECONDS; anex/gunicorn_hooks.py)."""

from __future__ import annotations

import json
import select
import socket
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.roles import role_running, until_alive
from tests.servers import free_port

pytestmark = pytest.mark.django_db(transaction=True)
# Generous against a busy machine: the bound under test is 2 s.
ANSWER_WITHIN = 30


def healthz(port: int) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz",
                                    timeout=ANSWER_WITHIN) as response:
            return int(response.status)
    except OSError:
        return 0


@contextmanager
def web_role(tmp_path: Path, **environment: str) -> Iterator[int]:
    """The web role with one process of two threads, its timeouts 2 s."""
    port = free_port()
    log = tmp_path / "web.log"
    settings = {"ANEX_WEB_BIND": f"127.0.0.1:{port}", "ANEX_WEB_WORKERS": "1",
                "ANEX_WEB_THREADS": "2", "ANEX_WEB_SOCKET_TIMEOUT_SECONDS": "2",
                "ANEX_API_BODY_SECONDS": "2", **environment}
    with role_running("web", log=log, **settings) as process:
        until_alive(lambda: healthz(port) == 200, process, log)
        yield port


def answer(client: socket.socket) -> bytes:
    """What the server sends until it closes the connection (b"": closed unanswered)."""
    client.settimeout(ANSWER_WITHIN)
    received = b""
    while chunk := client.recv(65536):
        received += chunk
    return received


def test_clients_that_stop_mid_request_are_cut_off_and_free_their_threads(
        tmp_path: Path) -> None:
    with web_role(tmp_path) as port:
        # given two clients holding both of the process's threads: one stops inside its
        # headers, the other inside its body (an upload form the view reads as it comes)
        in_headers = socket.create_connection(("127.0.0.1", port))
        in_headers.sendall(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n")
        in_body = socket.create_connection(("127.0.0.1", port))
        in_body.sendall(b"POST /storage/world/upload HTTP/1.1\r\nHost: localhost\r\n"
                        b"Content-Type: multipart/form-data; boundary=x\r\n"
                        b"Content-Length: 1000\r\n\r\n--x\r\n")
        started = time.monotonic()
        # when they send nothing more, then each is cut off at the socket timeout: the one
        # in its headers closed, the one in its body answered as S3 answers it
        with in_headers, in_body:
            assert answer(in_headers) == b""
            cut = answer(in_body)
        assert cut.startswith(b"HTTP/1.1 400"), cut
        assert b"RequestTimeout" in cut
        assert time.monotonic() - started < ANSWER_WITHIN
        # and the threads answer others again
        assert healthz(port) == 200


def test_a_trickled_realtime_body_is_cut_off_at_its_deadline(tmp_path: Path) -> None:
    # The socket timeout bounds each read; a client sending a byte every 0.3 s never meets
    # it. The body's deadline bounds them all: 408, with most of the body never sent.
    with web_role(tmp_path, ANEX_WEB_SOCKET_TIMEOUT_SECONDS="10") as port, \
            socket.create_connection(("127.0.0.1", port)) as client:
        body = json.dumps({"model": "all-minilm-l6-v2", "input": "x" * 200}).encode()
        client.sendall(b"POST /realtime/v1/embeddings HTTP/1.1\r\nHost: localhost\r\n"
                       b"Content-Type: application/json\r\n"
                       b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n")
        sent = 0
        deadline = time.monotonic() + ANSWER_WITHIN
        while sent < len(body) and time.monotonic() < deadline:
            if select.select([client], [], [], 0.3)[0]:
                break  # answered
            client.sendall(body[sent:sent + 1])
            sent += 1
        cut = answer(client)
        assert cut.startswith(b"HTTP/1.1 408"), cut
        assert b"did not arrive in time" in cut
        assert sent < len(body) / 2
