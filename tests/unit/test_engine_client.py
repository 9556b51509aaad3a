"""The web tier's client of the engine servers (realtime/engine_client.py) against engine
servers that misbehave as a socket can: one that restarted and closed its pooled
connections, one that answers without a Content-Length, half an answer, an answer that
never comes, nothing listening. The real engine server answering it is in
test_realtime_serving.py (signed requests, several engines in turn)."""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import trustme

from realtime import engine_client
from realtime.engine_client import EngineTimedOut, EngineUnavailable, engine_call

ANSWER = {"data": [{"embedding": [1.0], "prompt_tokens": 3}]}
BODY = {"model": "m", "input": ["abc"]}


def answer(payload: dict[str, Any] = ANSWER, *, extra: str = "") -> bytes:
    data = json.dumps(payload).encode()
    return (f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n{extra}"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


def read_request(reader: Any) -> tuple[str, dict[str, str], bytes] | None:
    """One request from a connection (None once the client closed it)."""
    line = reader.readline()
    if not line:
        return None
    headers = {}
    while (header := reader.readline()) not in (b"\r\n", b""):
        name, _, value = header.decode().partition(":")
        headers[name.strip().lower()] = value.strip()
    return line.decode(), headers, reader.read(int(headers["content-length"]))


@contextmanager
def raw_server(serve: Callable[[socket.socket, Any, int], None],
               tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, list[int]]]:
    """A server on loopback calling serve(connection, its reader, its number) for each
    connection it accepts: its URL, and how many connections it has accepted."""
    listening = socket.create_server(("127.0.0.1", 0))
    accepted: list[int] = []

    def loop() -> None:
        while True:
            try:
                connection, _ = listening.accept()
            except OSError:
                return
            accepted.append(len(accepted))
            threading.Thread(target=_serve, args=(connection, len(accepted) - 1),
                             daemon=True).start()

    def _serve(connection: socket.socket, number: int) -> None:
        if tls is not None:
            try:
                connection = tls.wrap_socket(connection, server_side=True)
            except OSError:  # the client refused the certificate
                connection.close()
                return
        with connection, connection.makefile("rb") as reader:
            serve(connection, reader, number)

    threading.Thread(target=loop, daemon=True).start()
    scheme = "https" if tls is not None else "http"
    try:
        yield f"{scheme}://127.0.0.1:{listening.getsockname()[1]}", accepted
    finally:
        listening.close()


@pytest.fixture(autouse=True)
def fresh_pool(settings: Any) -> Iterator[None]:
    settings.ANEX_REALTIME_ENGINE_SECRET = ""
    settings.ANEX_REALTIME_TIMEOUT_SECONDS = 30
    engine_client._idle.clear()
    yield
    for connections in engine_client._idle.values():
        for connection in connections:
            connection.close()
    engine_client._idle.clear()


def test_requests_reuse_one_connection_and_send_what_the_engine_server_checks() -> None:
    seen: list[tuple[str, dict[str, str], bytes]] = []

    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        while (request := read_request(reader)) is not None:
            seen.append(request)
            connection.sendall(answer())

    with raw_server(serve) as (url, accepted):
        for _ in range(5):
            assert engine_call(urls=(url,), path="/v1/embeddings", body=BODY) == ANSWER
    assert len(accepted) == 1
    line, headers, body = seen[0]
    assert line == "POST /v1/embeddings HTTP/1.1\r\n"
    assert headers["host"] == url.removeprefix("http://")  # the server's Host check
    assert headers["content-type"] == "application/json"
    assert int(headers["x-anex-timeout-ms"]) == 25_000  # the deadline, 5 s before ours
    assert json.loads(body) == BODY


def test_a_connection_the_engine_closed_while_pooled_is_not_a_failed_request() -> None:
    # An engine server that closes each connection after one answer, without saying so
    # (as one that restarted): the pooled connection is dropped, the request answered.
    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        if read_request(reader) is not None:
            connection.sendall(answer())

    with raw_server(serve) as (url, accepted):
        for _ in range(3):
            assert engine_call(urls=(url,), path="/v1/embeddings", body=BODY) == ANSWER
    assert len(accepted) == 3


def test_a_connection_closed_after_the_request_was_read_is_tried_again_once() -> None:
    # The request reached the server, which closed without a word: sent once more (a
    # stale connection looks the same), then a 502, as urllib3 did.
    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        read_request(reader)

    with raw_server(serve) as (url, accepted), pytest.raises(EngineUnavailable):
        engine_call(urls=(url,), path="/v1/embeddings", body=BODY)
    assert len(accepted) == 2


@pytest.mark.parametrize("reply", [
    pytest.param(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n{}",
                 id="no Content-Length"),
    pytest.param(answer()[:-5], id="half an answer"),
    pytest.param(b"SSH-2.0-OpenSSH_9.2\r\n", id="not HTTP"),
])
def test_an_answer_the_client_cannot_read_is_502(reply: bytes) -> None:
    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        if read_request(reader) is not None:
            connection.sendall(reply)
            connection.shutdown(socket.SHUT_WR)

    with raw_server(serve) as (url, _), pytest.raises(EngineUnavailable):
        engine_call(urls=(url,), path="/v1/embeddings", body=BODY)


def test_an_answer_asking_to_close_is_not_pooled() -> None:
    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        while read_request(reader) is not None:
            connection.sendall(answer(extra="Connection: close\r\n"))

    with raw_server(serve) as (url, accepted):
        for _ in range(2):
            engine_call(urls=(url,), path="/v1/embeddings", body=BODY)
    assert len(accepted) == 2
    assert not engine_client._idle.get(url)


def test_an_engine_that_took_the_request_and_did_not_answer_in_time_timed_out(
        settings: Any) -> None:
    settings.ANEX_REALTIME_TIMEOUT_SECONDS = 0.3
    released = threading.Event()

    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        read_request(reader)
        released.wait(5)

    with raw_server(serve) as (url, accepted), pytest.raises(EngineTimedOut):
        try:
            engine_call(urls=(url,), path="/v1/embeddings", body=BODY)
        finally:
            released.set()
    assert len(accepted) == 1  # never sent twice: the engine has the work


def test_nothing_listening_is_502_after_each_engine_was_tried() -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{probe.getsockname()[1]}"
    with pytest.raises(EngineUnavailable):
        engine_call(urls=(down,), path="/v1/embeddings", body=BODY)

    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        while read_request(reader) is not None:
            connection.sendall(answer())

    with raw_server(serve) as (url, _):
        for _ in range(4):  # each request's turn, the down engine's covered by the next
            assert engine_call(urls=(down, url), path="/v1/embeddings", body=BODY) == ANSWER


def test_the_host_header_names_the_port_unless_it_is_the_schemes_own() -> None:
    assert engine_client._address("http://127.0.0.1:8101").host_header == "127.0.0.1:8101"
    assert engine_client._address("http://[::1]:8102").host_header == "[::1]:8102"
    assert engine_client._address("https://engine-1.internal").host_header == \
        "engine-1.internal"
    assert engine_client._address("https://engine-1.internal:8443").host_header == \
        "engine-1.internal:8443"


def test_an_https_engine_is_answered_over_tls_with_its_certificate_checked(
        ca: trustme.CA, monkeypatch: pytest.MonkeyPatch) -> None:
    served = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(served)
    trusting = ssl.create_default_context()
    ca.configure_trust(trusting)

    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        while read_request(reader) is not None:
            connection.sendall(answer())

    with raw_server(serve, tls=served) as (url, accepted):
        assert url.startswith("https://")
        # The system's CAs alone do not know the test CA: refused, never sent in clear.
        with pytest.raises(EngineUnavailable):
            engine_call(urls=(url,), path="/v1/embeddings", body=BODY)
        monkeypatch.setattr(engine_client, "_tls", trusting)
        for _ in range(2):
            assert engine_call(urls=(url,), path="/v1/embeddings", body=BODY) == ANSWER
    assert len(accepted) == 2  # the refused handshake, then one connection kept


def test_a_tls_handshake_that_never_comes_is_tried_again_then_502(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # A server that accepts and never speaks TLS: the handshake times out as a connect
    # does (tried again, then 502), never a 500 or a billed timeout.
    monkeypatch.setattr(engine_client, "CONNECT_TIMEOUT_SECONDS", 0.2)
    listening = socket.create_server(("127.0.0.1", 0))
    try:
        url = f"https://127.0.0.1:{listening.getsockname()[1]}"
        with pytest.raises(EngineUnavailable):
            engine_call(urls=(url,), path="/v1/embeddings", body=BODY)
    finally:
        listening.close()


def test_a_request_the_engine_does_not_read_in_time_is_502_and_not_sent_again(
        settings: Any) -> None:
    # The engine never reads a body larger than the sockets' buffers: it cannot have
    # computed anything, so nothing is billed (a 502, not a timeout) and once is enough.
    settings.ANEX_REALTIME_TIMEOUT_SECONDS = 0.3
    released = threading.Event()

    def serve(connection: socket.socket, reader: Any, number: int) -> None:
        released.wait(5)

    with raw_server(serve) as (url, accepted), pytest.raises(EngineUnavailable):
        try:
            engine_call(urls=(url,), path="/v1/embeddings",
                        body={"model": "m", "input": ["x" * 32 * 1024 * 1024]})
        finally:
            released.set()
    assert len(accepted) == 1
