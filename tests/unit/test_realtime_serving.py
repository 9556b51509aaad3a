"""The realtime engine server's own parts, without an engine: the micro-batching queue (one
engine call answers every request waiting, each with its own slice, a failure reaches
every waiter) and the loopback protocol's refusals. The server on real engines is in
test_realtime_engines.py."""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from django.core.exceptions import ImproperlyConfigured

from inference.kinds.embed import EmbedKind
from realtime.serving import Batcher, BatchFailed, EngineServer, NotTaken, Served

# The servers' serve_forever polls for its shutdown this often (by default every half a
# second, paid at each server's stop).
POLL = {"poll_interval": 0.01}


class Engine:
    """Stands in for a model: doubles each item, holding its first call until released."""

    def __init__(self) -> None:
        self.calls: list[list[Any]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = False

    def run(self, items: list[Any]) -> list[Any]:
        self.calls.append(list(items))
        self.entered.set()
        self.release.wait(10)
        if self.fail:
            raise RuntimeError("out of memory")
        return [item * 2 for item in items]


def test_requests_waiting_on_a_busy_engine_are_answered_by_one_call_each_their_own() -> None:
    engine = Engine()
    batcher = Batcher("test", engine.run, max_items=100)
    answers: dict[int, list[Any]] = {}

    def submit(n: int) -> None:
        answers[n] = batcher.submit([n, n + 100])

    first = threading.Thread(target=submit, args=(0,))
    first.start()
    assert engine.entered.wait(10)  # the engine is busy with the first request
    others = [threading.Thread(target=submit, args=(n,)) for n in range(1, 6)]
    for thread in others:
        thread.start()
    while batcher.queue.qsize() < 5:
        threading.Event().wait(0.01)
    engine.release.set()
    for thread in [first, *others]:
        thread.join(10)
    assert answers == {n: [2 * n, 2 * (n + 100)] for n in range(6)}
    # one call for the first, one for the five that waited meanwhile
    assert [len(call) for call in engine.calls] == [2, 10]
    assert (batcher.calls, batcher.requests) == (2, 6)


def test_a_batch_never_takes_more_than_its_limit() -> None:
    engine = Engine()
    batcher = Batcher("test", engine.run, max_items=3)
    first = threading.Thread(target=batcher.submit, args=([0],))
    first.start()
    assert engine.entered.wait(10)
    rest = [threading.Thread(target=batcher.submit, args=([n],)) for n in range(1, 6)]
    for thread in rest:
        thread.start()
    while batcher.queue.qsize() < 5:
        threading.Event().wait(0.01)
    engine.release.set()
    for thread in [first, *rest]:
        thread.join(10)
    assert [len(call) for call in engine.calls] == [1, 3, 2]


def test_an_engine_failure_reaches_every_request_of_its_batch() -> None:
    engine = Engine()
    engine.fail = True
    engine.release.set()
    batcher = Batcher("test", engine.run, max_items=10)
    with pytest.raises(BatchFailed, match="out of memory"):
        batcher.submit([1])
    engine.fail = False
    assert batcher.submit([2]) == [4]  # and the queue goes on


def test_a_full_queue_refuses_at_once_and_the_engine_never_sees_it() -> None:
    engine = Engine()
    batcher = Batcher("test", engine.run, max_items=2, max_queued=3)
    first = threading.Thread(target=batcher.submit, args=([0],))
    first.start()
    assert engine.entered.wait(10)  # the engine is busy; the queue fills behind it
    waiting = [threading.Thread(target=batcher.submit, args=(items,))
               for items in ([1, 2], [3])]
    for thread in waiting:
        thread.start()
    while batcher.queued < 3:
        threading.Event().wait(0.01)
    with pytest.raises(NotTaken, match="queue is full"):
        batcher.submit([4])
    engine.release.set()
    for thread in [first, *waiting]:
        thread.join(10)
    assert sorted(item for call in engine.calls for item in call) == [0, 1, 2, 3]
    assert (batcher.refused, batcher.queued) == (1, 0)


def test_work_whose_deadline_passed_while_it_waited_is_dropped_uncomputed() -> None:
    engine = Engine()
    batcher = Batcher("test", engine.run, max_items=10)
    first = threading.Thread(target=batcher.submit, args=([0],))
    first.start()
    assert engine.entered.wait(10)
    outcome: list[BaseException] = []

    def late() -> None:
        try:
            batcher.submit([7], deadline=time.monotonic() + 0.05)
        except NotTaken as exc:
            outcome.append(exc)

    waiter = threading.Thread(target=late)
    waiter.start()
    time.sleep(0.2)  # the caller's deadline passes while the engine is busy
    engine.release.set()
    first.join(10)
    waiter.join(10)
    assert [str(exc) for exc in outcome] == ["the request's deadline passed while it waited"]
    assert [item for call in engine.calls for item in call] == [0]
    assert batcher.expired == 1
    assert batcher.submit([8], deadline=time.monotonic() + 10) == [16]  # in time: answered


@pytest.fixture
def server() -> Iterator[str]:
    engine = Engine()
    engine.release.set()
    served = {"m": Served(model_id="m", kind=EmbedKind(),
                          batcher=Batcher("m", lambda rows: [
                              {"embedding": [1.0], "prompt_tokens": len(row.text)}
                              for row in rows], 10), load_seconds=1.0)}
    httpd = EngineServer(("127.0.0.1", 0), served)
    thread = threading.Thread(target=httpd.serve_forever, kwargs=POLL, daemon=True)
    thread.start()
    yield httpd.url
    httpd.shutdown()
    httpd.server_close()


def post(url: str, body: object) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(  # noqa: S310 - loopback
        url, data=json.dumps(body).encode(), method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 - loopback
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        return error.code, json.loads(error.read())


def test_the_protocol_answers_and_refuses(server: str) -> None:
    assert post(f"{server}/v1/embeddings", {"model": "m", "input": ["abc", "de"]}) == (
        200, {"data": [{"embedding": [1.0], "prompt_tokens": 3},
                       {"embedding": [1.0], "prompt_tokens": 2}]})
    assert post(f"{server}/v1/embeddings", {"model": "other", "input": ["a"]})[0] == 404
    assert post(f"{server}/v1/systemone", {"model": "m", "state": "a",
                                           "questions": {}})[0] == 404  # not a decision model
    assert post(f"{server}/v1/embeddings", {"model": "m", "input": "not a list"})[0] == 400
    assert post(f"{server}/v1/embeddings", ["not an object"])[0] == 400
    with urllib.request.urlopen(f"{server}/health", timeout=10) as response:  # noqa: S310
        health = json.loads(response.read())
    assert health == {"models": {"m": {"task": "embed", "load_seconds": 1.0,
                                       "engine_calls": 1, "requests": 1}}}


def test_a_request_past_its_deadline_is_503_with_retry_after_and_not_computed(
        server: str) -> None:
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{server}/v1/embeddings", data=json.dumps({"model": "m", "input": ["a"]}).encode(),
        method="POST", headers={"X-Anex-Timeout-Ms": "0"})
    with pytest.raises(urllib.error.HTTPError) as caught:
        urllib.request.urlopen(request, timeout=10)  # noqa: S310 - loopback
    assert caught.value.code == 503
    assert caught.value.headers["Retry-After"] == "1"
    assert "deadline passed" in json.loads(caught.value.read())["detail"]
    with urllib.request.urlopen(f"{server}/health", timeout=10) as response:  # noqa: S310
        assert json.loads(response.read())["models"]["m"]["engine_calls"] == 0


SECRET = "the-shared-secret"
BODY = json.dumps({"model": "m", "input": ["abc"]}).encode()


class Counted:
    """The stand-in embedding model of a signed server, counting the rows it embedded."""

    def __init__(self) -> None:
        self.rows = 0

    def run(self, rows: list[Any]) -> list[Any]:
        self.rows += len(rows)
        return [{"embedding": [1.0], "prompt_tokens": len(row.text)} for row in rows]


@contextmanager
def signed_server(**options: Any) -> Iterator[tuple[EngineServer, Counted]]:
    """An engine server that answers only what the web tier signs with their secret."""
    model = Counted()
    served = {"m": Served(model_id="m", kind=EmbedKind(),
                          batcher=Batcher("m", model.run, 10), load_seconds=1.0)}
    httpd = EngineServer(("127.0.0.1", 0), served, secret=SECRET, **options)
    thread = threading.Thread(target=httpd.serve_forever, kwargs=POLL, daemon=True)
    thread.start()
    try:
        yield httpd, model
    finally:
        httpd.shutdown()
        httpd.server_close()


@pytest.fixture
def signed(settings: Any) -> Iterator[str]:
    settings.ANEX_REALTIME_ENGINE_SECRET = SECRET
    with signed_server() as (httpd, _):
        yield httpd.url


def signing(url: str, body: bytes = BODY, *, timeout_ms: str = "25000",
            host: str | None = None) -> dict[str, str]:
    """The headers the web tier signs a POST /v1/embeddings to `url` with."""
    from realtime.engine_client import engine_signed_headers

    return {"X-Anex-Timeout-Ms": timeout_ms, **engine_signed_headers(
        SECRET, host=host or url.removeprefix("http://"), path="/v1/embeddings",
        timeout_ms=timeout_ms, body_digest=hashlib.sha256(body).hexdigest())}


def attempt(url: str, headers: dict[str, str], body: bytes) -> tuple[int, str]:
    request = urllib.request.Request(  # noqa: S310 - loopback
        f"{url}/v1/embeddings", data=body, method="POST", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310
            return int(response.status), ""
    except urllib.error.HTTPError as error:
        return error.code, str(json.loads(error.read())["detail"])


UNSIGNED = (403, "a request to this engine server must be signed by the web tier")
REPLAYED = (403, "this signed request was answered before: a replay is refused")


def test_an_engine_server_answers_only_the_web_tiers_signed_requests(signed: str) -> None:
    from realtime.engine_client import engine_call

    # Another local process, without the secret: unsigned, guessed, replayed from long ago,
    # or a signature moved onto another body (with or without that body's digest).
    assert attempt(signed, {}, BODY) == UNSIGNED
    assert attempt(signed, {**signing(signed), "X-Anex-Signature": "0" * 64}, BODY) == UNSIGNED
    with mock_time(time.time() - 3600):
        old = signing(signed)
    assert attempt(signed, old, BODY) == UNSIGNED
    other = BODY.replace(b"abc", b"xyz")
    assert attempt(signed, signing(signed), other) == UNSIGNED
    assert attempt(signed, {**signing(signed), "X-Anex-Body-SHA256":
                            hashlib.sha256(other).hexdigest()}, other) == UNSIGNED
    # A page in a browser reaching it by a rebound name sends another Host.
    assert attempt(signed, {**signing(signed), "Host": "evil.example:80"}, BODY) == (
        403, "this engine server answers only requests for its own address")
    assert attempt(signed, signing(signed), BODY) == (200, "")
    # and the web tier's own client signs every request it sends
    assert engine_call(urls=(signed,), path="/v1/embeddings",
                       body={"model": "m", "input": ["abcd"]}) == {
        "data": [{"embedding": [1.0], "prompt_tokens": 4}]}


@contextmanager
def mock_time(now: float) -> Iterator[None]:
    from unittest import mock

    with mock.patch("realtime.engine_client.time.time", return_value=now):
        yield


def raw(url: str, data: bytes, *, timeout: float = 10) -> tuple[int, dict[str, Any], bool]:
    """Send `data` as it is on a new connection to `url`: the answer's status and body, and
    whether the server closed the connection after it."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        body = json.loads(response.read())
        return response.status, body, response.will_close


def head(url: str, headers: dict[str, str], length: int) -> bytes:
    lines = ["POST /v1/embeddings HTTP/1.1", f"Host: {url.removeprefix('http://')}",
             *(f"{name}: {value}" for name, value in headers.items()),
             f"Content-Length: {length}", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def test_a_request_not_signed_is_refused_before_its_body_is_read(settings: Any) -> None:
    # given an engine server that waits a minute for a request's body
    with signed_server(read_seconds=60.0) as (httpd, model):
        url = httpd.url
        # when requests announce a 26 MiB body and send only their head: unsigned, signed
        # with a guess, or signed by the web tier for another body whose digest they bear
        for headers in ({}, {**signing(url), "X-Anex-Signature": "0" * 64},
                        {**signing(url), "X-Anex-Body-SHA256": "0" * 64}):
            started = time.monotonic()
            status, body, closed = raw(url, head(url, headers, 26 * 1024 * 1024))
            # then each is refused at once, on its head (had the server read the body, it
            # would be waiting for it), and its connection closed
            assert (status, body["detail"], closed) == (*UNSIGNED, True)
            assert time.monotonic() - started < 30
        assert model.rows == 0


def test_a_replayed_request_is_refused(settings: Any) -> None:
    with signed_server() as (httpd, model):
        # given a request the web tier signed, answered
        request = head(httpd.url, signing(httpd.url), len(BODY)) + BODY
        assert raw(httpd.url, request)[0] == 200
        # when the same bytes are sent again, within the signature's window
        status, body, _ = raw(httpd.url, request)
        # then they are refused, and the model embedded the text once
        assert (status, body["detail"]) == REPLAYED
        assert model.rows == 1


def test_an_altered_timeout_or_host_is_refused(settings: Any) -> None:
    with signed_server() as (httpd, model):
        url = httpd.url
        # A signed request whose deadline header was raised (the engine would take work the
        # web tier has stopped waiting for), or sent for another of the server's own names
        # than the one signed ("localhost" is one for a loopback server).
        raised = {**signing(url), "X-Anex-Timeout-Ms": "3600000"}
        assert attempt(url, raised, BODY) == UNSIGNED
        port = url.rsplit(":", 1)[1]
        moved = {**signing(url), "Host": f"localhost:{port}"}
        assert attempt(url, moved, BODY) == UNSIGNED
        # signed for that name, it is answered
        assert attempt(url, {**signing(url, host=f"localhost:{port}"),
                             "Host": f"localhost:{port}"}, BODY) == (200, "")
        assert model.rows == 1


def test_a_non_ascii_signature_header_is_a_clean_403(settings: Any) -> None:
    with signed_server() as (httpd, model):
        url = httpd.url
        for name, value in (("X-Anex-Signature", "é" * 64), ("X-Anex-Timestamp", "²³"),
                            ("X-Anex-Body-SHA256", "ü" * 64)):
            request = head(url, {**signing(url), name: value}, len(BODY)) + BODY
            status, body, _ = raw(url, request)
            assert (status, body["detail"]) == UNSIGNED, name
        # and the server is unharmed: the next request is answered
        assert attempt(url, signing(url), BODY) == (200, "")
        assert model.rows == 1


def test_a_slow_client_is_cut_off(settings: Any) -> None:
    # given a server whose connections wait a second for a request, and take two for one
    with signed_server(idle_seconds=1.0, read_seconds=2.0) as (httpd, _):
        host, port = httpd.url.removeprefix("http://").rsplit(":", 1)
        # a client that connects and sends nothing is closed on
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            started = time.monotonic()
            assert sock.recv(1) == b""
            assert time.monotonic() - started < 20
        # and so is one that sends its head a byte every tenth of a second: each read is
        # quick, the request as a whole is not
        request = head(httpd.url, signing(httpd.url), len(BODY)) + BODY
        with socket.create_connection((host, int(port)), timeout=30) as sock:
            started = time.monotonic()
            sent = 0
            try:
                for byte in request:
                    sock.sendall(bytes([byte]))
                    sent += 1
                    time.sleep(0.1)
                    if _closed(sock):
                        break
            except OSError:
                pass  # reset: the server closed on it
            assert sent < len(request)
            assert time.monotonic() - started < 20


def _closed(sock: socket.socket) -> bool:
    """Whether the peer has closed the connection (a read would find its end)."""
    try:
        return sock.recv(1, socket.MSG_DONTWAIT | socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False


def test_a_handed_listening_socket_is_served_as_it_is() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(8)
        port = listening.getsockname()[1]
        served = {"m": Served(model_id="m", kind=EmbedKind(),
                              batcher=Batcher("m", lambda rows: [], 10), load_seconds=1.0)}
        httpd = EngineServer(("127.0.0.1", 0), served, fd=os.dup(listening.fileno()))
    thread = threading.Thread(target=httpd.serve_forever, kwargs=POLL, daemon=True)
    thread.start()
    try:
        assert httpd.url == f"http://127.0.0.1:{port}"
        with urllib.request.urlopen(f"{httpd.url}/health", timeout=10) as response:  # noqa: S310
            assert json.loads(response.read())["models"]["m"]["task"] == "embed"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_several_engines_of_a_model_take_requests_in_turn_and_cover_one_down(
        settings: Any) -> None:
    from realtime.engine_client import engine_call

    settings.ANEX_REALTIME_ENGINE_SECRET = ""
    seen: dict[str, int] = {}
    servers = []

    def counting(name: str) -> Callable[[list[Any]], list[Any]]:
        def run(rows: list[Any]) -> list[Any]:
            seen[name] = seen.get(name, 0) + len(rows)
            return [{"embedding": [1.0], "prompt_tokens": 1} for _ in rows]

        return run

    for name in ("a", "b"):
        served = {"m": Served(model_id="m", kind=EmbedKind(),
                              batcher=Batcher("m", counting(name), 10), load_seconds=1.0)}
        httpd = EngineServer(("127.0.0.1", 0), served)
        threading.Thread(target=httpd.serve_forever, kwargs=POLL, daemon=True).start()
        servers.append(httpd)
    with socket_closed_port() as down:
        urls = (servers[0].url, servers[1].url, down)
        try:
            for _ in range(6):
                engine_call(urls=urls, path="/v1/embeddings",
                            body={"model": "m", "input": ["x"]})
        finally:
            for httpd in servers:
                httpd.shutdown()
                httpd.server_close()
    # Six requests over three engines in turn, one of them down: each live engine took its
    # own two turns, and the down one's two went to the engine after it.
    assert sum(seen.values()) == 6 and sorted(seen.values()) in ([2, 4], [3, 3])


@contextmanager
def socket_closed_port() -> Iterator[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    yield f"http://127.0.0.1:{port}"


def test_engine_urls_are_https_or_loopback_http_and_several_per_model() -> None:
    from anex.env import Env
    from tests.unit.test_env import _start_django

    def engines(value: str) -> dict[str, tuple[str, ...]]:
        return Env({"ANEX_REALTIME_ENGINES": value}).url_lists("ANEX_REALTIME_ENGINES")

    assert engines("all-minilm-l6-v2=https://engine-1.internal:8443,https://engine-2.internal"
                   ":8443/;laya=http://127.0.0.1:8101;laya=http://[::1]:8102") == {
        "all-minilm-l6-v2": ("https://engine-1.internal:8443", "https://engine-2.internal:8443"),
        "laya": ("http://127.0.0.1:8101", "http://[::1]:8102")}
    assert engines("m=https://e1.internal,https://e2.internal;m=http://localhost:9") == {
        "m": ("https://e1.internal", "https://e2.internal", "http://localhost:9")}
    with pytest.raises(ImproperlyConfigured, match="is not model-id=https://host:port"):
        engines("laya=ftp://127.0.0.1:8101")
    # the settings read it so: a process given an engine on another machine over plain
    # http:// refuses to start
    bad = _start_django(ANEX_REALTIME_ENGINES="laya=http://engine.internal:8101")
    assert bad.returncode != 0
    assert "is plain http:// to another machine: use https://" in bad.stderr
