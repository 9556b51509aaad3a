"""The realtime engine server: one long-running process holding a warm engine per model it
serves, answering the web tier over loopback HTTP (docs/realtime.md, "How it is served").

    manage.py serve_realtime --model all-minilm-l6-v2 --port 8101

Requests that arrive while an engine is busy wait in its queue, and the engine's thread
takes everything waiting as one batch: one vLLM call for many concurrent requests, the
way a batch chunk is one call for many rows. Nothing is loaded per request. What a body
means, the engine call and the answer are the model's task kind's (inference/kinds:
realtime_rows, realtime_run, realtime_reply); the paths are the kinds' batch endpoints.

The protocol, spoken only to the web tier on a loopback address (it has no keys of its
own; authentication, limits and billing are the web tier's):

    GET  /health           200 {"models": {"<id>": {"task", "load_seconds", "engine_calls",
                                                 "requests"}}}
    POST /v1/embeddings    {"model", "input": ["<text>", ...], "dimensions": n | null}
         200 {"data": [{"embedding": [...], "prompt_tokens": n} | {"error": {...}}, ...]}
    POST /v1/systemone     {"model", "state", "questions", "lang"}
         200 {"answers", "input_tokens", "routing"} | {"error": {...}, "routing"}

400 for a body it cannot read, 404 for a model it does not serve, 500 when the engine
failed (the web tier answers that 502).
"""

from __future__ import annotations

import json
import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.conf import settings

from inference.catalog import model_get
from inference.engines import EngineNotConfigured
from inference.engines.registry import Engine
from inference.kinds import AnyKind, kind_for

logger = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
# A request each kind's first engine call is paid with (a forward body, as the web sends).
WARM_UP: dict[str, Any] = {
    "input": ["warm up"], "state": "warm up",
    "questions": {"ready": {"type": "noul", "instructions": "Is this ready?"}},
}


class EngineFailed(Exception):
    pass


@dataclass
class _Pending:
    items: list[Any]
    done: threading.Event = field(default_factory=threading.Event)
    results: list[Any] = field(default_factory=list)
    error: BaseException | None = None


class Batcher:
    """One engine's queue and the one thread that runs it: each call takes every request
    waiting (up to max_items items) and answers each with its own slice."""

    def __init__(self, name: str, run: Callable[[list[Any]], list[Any]],
                 max_items: int) -> None:
        self.run = run
        self.max_items = max_items
        self.queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self.calls = 0  # engine calls, and the requests they answered (GET /health)
        self.requests = 0
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self.thread.start()

    def submit(self, items: list[Any]) -> list[Any]:
        pending = _Pending(items)
        self.queue.put(pending)
        pending.done.wait()
        if pending.error is not None:
            raise EngineFailed(str(pending.error)) from pending.error
        return pending.results

    def _loop(self) -> None:
        while True:
            batch = [self.queue.get()]
            size = len(batch[0].items)
            while size < self.max_items:
                try:
                    batch.append(self.queue.get_nowait())
                except queue.Empty:
                    break
                size += len(batch[-1].items)
            self._answer(batch)

    def _answer(self, batch: list[_Pending]) -> None:
        self.calls += 1
        self.requests += len(batch)
        try:
            results = self.run([item for pending in batch for item in pending.items])
            if len(results) != sum(len(pending.items) for pending in batch):
                raise EngineFailed("the engine answered a different number of items")
        except Exception as exc:  # the engine's failure is every waiting request's
            logger.exception("engine call failed for %d requests", len(batch))
            for pending in batch:
                pending.error = exc
                pending.done.set()
            return
        start = 0
        for pending in batch:
            pending.results = results[start:start + len(pending.items)]
            start += len(pending.items)
            pending.done.set()


@dataclass
class Served:
    model_id: str
    kind: AnyKind
    batcher: Batcher
    load_seconds: float


def engine_load(model_id: str) -> tuple[AnyKind, Engine]:
    """The warm engine for a realtime model and its kind, built from its checkpoint by the
    kind as a batch worker's is (inference/kinds/engines.py), but not through
    engine_for: that marks the model warm for the batch estimator, and a realtime server
    takes no chunk."""
    model = model_get(model_id)
    kind = kind_for(model) if model is not None else None
    if model is None or kind is None or not kind.realtime:
        raise EngineNotConfigured(f"model '{model_id}' is not a model served in realtime "
                                  "(an embedding or decision model)")
    checkpoint = settings.ANEX_CHECKPOINTS.get(model_id)
    if checkpoint is None or not checkpoint.is_dir():
        raise EngineNotConfigured(f"model '{model_id}' has no checkpoint directory in "
                                  "ANEX_CHECKPOINTS")
    return kind, kind.engine_build(model, checkpoint)


def served_build(model_id: str, kind: AnyKind, engine: Engine) -> Served:
    def run(rows: list[Any]) -> list[Any]:
        return kind.realtime_run(engine, rows)

    # The first call through a fresh engine pays for its kernels and caches (seconds on a
    # CPU): paid here, before the server answers anyone.
    run(kind.realtime_rows({"model": model_id, **WARM_UP}))
    return Served(model_id=model_id, kind=kind,
                  batcher=Batcher(model_id, run, kind.realtime_batch_rows),
                  load_seconds=engine.load_seconds)


class EngineServer(ThreadingHTTPServer):
    daemon_threads = True
    # Every web worker thread keeps a pooled connection open: allow a deep accept queue.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], served: dict[str, Served]) -> None:
        super().__init__(address, _Handler)
        self.served = served

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(self, method: str, path: str, body: bytes) -> tuple[int, dict[str, Any]]:
        if method == "GET" and path == "/health":
            return 200, {"models": {m.model_id: {"task": m.kind.task,
                                                 "load_seconds": round(m.load_seconds, 1),
                                                 "engine_calls": m.batcher.calls,
                                                 "requests": m.batcher.requests}
                                    for m in self.served.values()}}
        if method != "POST":
            return 404, {"detail": "Not found."}
        try:
            request = json.loads(body)
            if not isinstance(request, dict):
                raise ValueError("the body must be a JSON object")
            model = self.served.get(str(request.get("model")))
            if model is None or model.kind.endpoint != path:
                return 404, {"detail": f"model {request.get('model')!r} is not served here "
                                       f"on {path}"}
            return 200, model.kind.realtime_reply(
                model.batcher.submit(model.kind.realtime_rows(request)))
        except ValueError as exc:
            return 400, {"detail": str(exc)}
        except EngineFailed as exc:
            return 500, {"detail": f"the engine failed: {exc}"}


class _Handler(BaseHTTPRequestHandler):
    server: EngineServer
    protocol_version = "HTTP/1.1"  # keep-alive: the web tier pools its connections
    disable_nagle_algorithm = True

    def _serve(self) -> None:
        try:
            length = int(self.headers.get("Content-Length") or 0)
        except ValueError:
            length = -1
        if not 0 <= length <= MAX_BODY_BYTES:
            status, out = 400, {"detail": "a Content-Length up to 64 MiB is needed"}
            self.close_connection = True
        else:
            body = self.rfile.read(length) if length else b""
            status, out = self.server.answer(self.command, self.path, body)
        payload = json.dumps(out, separators=(",", ":")).encode()
        head = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}",
                "Content-Type: application/json", f"Content-Length: {len(payload)}"]
        if self.close_connection:
            head.append("Connection: close")
        # Head and body in one write: no small packet waits on a delayed ACK.
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)

    do_GET = _serve
    do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the web tier logs the requests; texts never reach a log here
