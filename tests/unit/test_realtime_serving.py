"""The realtime engine server's own parts, without an engine: the micro-batching queue (one
engine call answers every request waiting, each with its own slice, a failure reaches
every waiter) and the loopback protocol's refusals. The server on real engines is in
test_realtime_engines.py."""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from inference.kinds.embed import EmbedKind
from realtime.serving import Batcher, EngineFailed, EngineServer, Served


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
    with pytest.raises(EngineFailed, match="out of memory"):
        batcher.submit([1])
    engine.fail = False
    assert batcher.submit([2]) == [4]  # and the queue goes on


@pytest.fixture
def server() -> Iterator[str]:
    engine = Engine()
    engine.release.set()
    served = {"m": Served(model_id="m", kind=EmbedKind(),
                          batcher=Batcher("m", lambda rows: [
                              {"embedding": [1.0], "prompt_tokens": len(row.text)}
                              for row in rows], 10), load_seconds=1.0)}
    httpd = EngineServer(("127.0.0.1", 0), served)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
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
