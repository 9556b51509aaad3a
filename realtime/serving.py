"""The realtime engine server: one long-running process holding a warm engine per model it
serves, answering the web tier over loopback HTTP (docs/realtime.md, "How it is served").

    manage.py serve_realtime --model all-minilm-l6-v2 --port 8101

Requests that arrive while an engine is busy wait in its queue, and the engine's thread
takes everything waiting as one batch: one vLLM call for many concurrent requests, the
way a batch chunk is one call for many rows. Nothing is loaded per request. What a body
means, the engine call and the answer are the model's task kind's (inference/kinds:
realtime_rows, realtime_run, realtime_reply); the paths are the kinds' batch endpoints.

The protocol, spoken only to the web tier: every request but GET /health signed with the
secret they share (ANEX_REALTIME_ENGINE_SECRET; EngineServer), each with its deadline
(X-Anex-Timeout-Ms: the engine takes the work only before it). Customers' keys, limits
and billing are the web tier's:

    GET  /health           200 {"models": {"<id>": {"task", "load_seconds", "engine_calls",
                                                 "requests"}}}
    POST /v1/embeddings    {"model", "input": ["<text>", ...], "dimensions": n | null}
         200 {"data": [{"embedding": [...], "prompt_tokens": n} | {"error": {...}}, ...]}
    POST /v1/systemone     {"model", "state", "questions", "lang"}
         200 {"answers", "input_tokens", "routing"} | {"error": {...}, "routing"}

400 for a body it cannot read, 403 for a request not signed by the web tier (or for
another Host, or signed and answered before: a replay), 404 for a model it does not serve,
500 when the engine failed (the web tier answers that 502), 503 with Retry-After when its
queue is full or the request's deadline passed while it waited (nothing computed).

A request is judged on its head before its body is read (issue 40 L2): the Host, then the
signature, which covers the body through its SHA-256 (checked once the body is read), the
timeout header and the Host, then its nonce, which is answered once within the
signature's window. A refused request's body is never read, and its connection is closed.
Each connection has a socket timeout, and each request's head and body must arrive within
REQUEST_READ_SECONDS of its first byte, so a client that sends slowly, or not at all, holds
a thread that long at most.
"""

from __future__ import annotations

import hashlib
import heapq
import hmac
import io
import json
import logging
import queue
import socket
import threading
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from django.conf import settings

from anex.logsafe import exception_summary
from inference.catalog import model_get
from inference.engines import EngineNotConfigured
from inference.engines.registry import Engine
from inference.kinds import AnyKind, kind_for
from realtime.constants import (
    ENGINE_BODY_DIGEST_HEADER,
    ENGINE_NONCE_HEADER,
    ENGINE_SIGNATURE_HEADER,
    ENGINE_SIGNATURE_SECONDS,
    ENGINE_TIMEOUT_HEADER,
    ENGINE_TIMESTAMP_HEADER,
)
from realtime.engine_client import engine_signature

logger = logging.getLogger(__name__)

# The largest body the web tier forwards: an embeddings request's 2,097,152 characters,
# each at most 6 bytes as JSON escapes them (anex/settings.py), and a margin.
MAX_BODY_BYTES = 26 * 1024 * 1024
# How many full engine calls' worth of items may wait: past it a request is refused 503.
QUEUED_BATCHES = 4
# A connection that sends nothing this long is closed (the web tier's pooled connections
# among them: its client drops one the server closed before it reuses it).
IDLE_SECONDS = 60.0
# A request's head and body arrive within this long of its first byte: the web tier sends
# both in one write, so only a client that trickles its bytes is cut.
REQUEST_READ_SECONDS = 30.0
# Nonces remembered at once (each for ENGINE_SIGNATURE_SECONDS past its timestamp): past it,
# signed requests are answered 503 until the oldest lapse, never let through unremembered.
MAX_NONCES = 1_000_000
UNSIGNED_DETAIL = "a request to this engine server must be signed by the web tier"
REPLAYED_DETAIL = "this signed request was answered before: a replay is refused"
RETRY_AFTER_SECONDS = 1
# A request each kind's first engine call is paid with (a forward body, as the web sends).
WARM_UP: dict[str, Any] = {
    "input": ["warm up"], "state": "warm up",
    "questions": {"ready": {"type": "noul", "instructions": "Is this ready?"}},
}


class BatchFailed(Exception):
    """The engine call of a request's batch failed (or answered a different number of
    items): every request in the batch is answered 500, which the web tier answers 502."""


class NotTaken(Exception):
    """The request was not taken: the engine's queue is full, its deadline passed while it
    waited, or its nonce cannot be remembered. Nothing was computed; the web tier answers
    503 with Retry-After (realtime.engine_client EngineAtCapacity)."""


@dataclass
class _Pending:
    items: list[Any]
    deadline: float | None = None  # time.monotonic() past which the engine must not take it
    done: threading.Event = field(default_factory=threading.Event)
    results: list[Any] = field(default_factory=list)
    error: BaseException | None = None


class Batcher:
    """One engine's queue and the one thread that runs it: each call takes every request
    waiting (up to max_items items) and answers each with its own slice.

    The queue is bounded: a request that would put more than max_queued items in it is
    refused at once (NotTaken), so a slow engine sheds load instead of piling up work
    nobody will wait for. A request whose deadline passes while it waits is dropped when
    its turn comes, uncomputed (NotTaken): the web tier has given up on it by then."""

    def __init__(self, name: str, run: Callable[[list[Any]], list[Any]],
                 max_items: int, max_queued: int | None = None) -> None:
        self.run = run
        self.max_items = max_items
        self.max_queued = max_queued if max_queued is not None else QUEUED_BATCHES * max_items
        self.queue: queue.SimpleQueue[_Pending] = queue.SimpleQueue()
        self.queued = 0  # items waiting, under _lock
        self._lock = threading.Lock()
        self.calls = 0  # engine calls, and the requests they answered (GET /health)
        self.requests = 0
        self.refused = 0  # requests refused with a full queue, and dropped past deadline
        self.expired = 0
        self.thread = threading.Thread(target=self._loop, name=f"batcher-{name}", daemon=True)
        self.thread.start()

    def submit(self, items: list[Any], deadline: float | None = None) -> list[Any]:
        pending = _Pending(items, deadline)
        with self._lock:
            if self.queued and self.queued + len(items) > self.max_queued:
                self.refused += 1
                raise NotTaken(f"the engine's queue is full ({self.queued} items waiting)")
            self.queued += len(items)
        self.queue.put(pending)
        pending.done.wait()
        if isinstance(pending.error, NotTaken):
            raise pending.error
        if pending.error is not None:
            raise BatchFailed(str(pending.error)) from pending.error
        return pending.results

    def _take(self, block: bool) -> _Pending | None:
        """The next request still worth computing, or None when none waits (block=False)."""
        while True:
            try:
                pending = self.queue.get() if block else self.queue.get_nowait()
            except queue.Empty:
                return None
            with self._lock:
                self.queued -= len(pending.items)
            if pending.deadline is None or time.monotonic() < pending.deadline:
                return pending
            self.expired += 1
            pending.error = NotTaken("the request's deadline passed while it waited")
            pending.done.set()

    def _loop(self) -> None:
        while True:
            first = self._take(block=True)
            assert first is not None  # a blocking take always returns one
            batch = [first]
            size = len(first.items)
            while size < self.max_items:
                pending = self._take(block=False)
                if pending is None:
                    break
                batch.append(pending)
                size += len(pending.items)
            self._answer(batch)

    def _answer(self, batch: list[_Pending]) -> None:
        self.calls += 1
        self.requests += len(batch)
        try:
            results = self.run([item for pending in batch for item in pending.items])
            if len(results) != sum(len(pending.items) for pending in batch):
                raise BatchFailed("the engine answered a different number of items")
        except Exception as exc:  # the engine's failure is every waiting request's
            logger.error("engine call failed for %d requests: %s", len(batch),
                         exception_summary(exc))
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


class _Nonces:
    """The nonces of the signed requests answered within the signature's window: a nonce is
    remembered until its timestamp is too old to be accepted anyway."""

    def __init__(self, most: int = MAX_NONCES) -> None:
        self.most = most
        self._lapses: dict[str, float] = {}
        self._order: list[tuple[float, str]] = []  # a heap, by when each lapses
        self._lock = threading.Lock()

    def first_use(self, nonce: str, *, lapses: float) -> bool:
        """Whether this is the nonce's first use (it is then remembered until `lapses`);
        NotTaken when MAX_NONCES are remembered, none lapsed."""
        now = time.time()
        with self._lock:
            while self._order and self._order[0][0] <= now:
                _, old = heapq.heappop(self._order)
                self._lapses.pop(old, None)
            if nonce in self._lapses:
                return False
            if len(self._lapses) >= self.most:
                raise NotTaken("too many signed requests in the replay window")
            self._lapses[nonce] = lapses
            heapq.heappush(self._order, (lapses, nonce))
            return True


def _latin1(value: str) -> bytes:
    """A header value as bytes to compare: hmac.compare_digest raises TypeError on a str
    with a character past ASCII, and a header may carry any Latin-1 character."""
    return value.encode("utf-8", "surrogateescape")


class EngineServer(ThreadingHTTPServer):
    """The engine server. With a `secret`, every request but GET /health must carry the
    web tier's signature of its head and body (realtime/engine_client.py, engine_signature),
    signed within ENGINE_SIGNATURE_SECONDS and never answered before, else 403; a request
    for another Host than its own address (or one of `hosts`) is 403 too, so a page in a
    local browser cannot reach it by DNS rebinding. With `fd`, it serves on a listening
    socket its parent bound and handed it (`make run`: no port is probed, then bound by
    another)."""

    daemon_threads = True
    # Every web worker thread keeps a pooled connection open: allow a deep accept queue.
    request_queue_size = 256

    def __init__(self, address: tuple[str, int], served: dict[str, Served], *,
                 secret: str = "", hosts: Collection[str] = (), fd: int | None = None,
                 idle_seconds: float = IDLE_SECONDS,
                 read_seconds: float = REQUEST_READ_SECONDS) -> None:
        super().__init__(address, _Handler, bind_and_activate=fd is None)
        if fd is not None:
            self.socket.close()
            self.socket = socket.socket(fileno=fd)
            self.server_address = self.socket.getsockname()
        self.served = served
        self.secret = secret
        self.idle_seconds = idle_seconds
        self.read_seconds = read_seconds
        self.nonces = _Nonces()
        host, port = self.server_address[:2]
        assert isinstance(host, str)  # an internet socket's address
        names = {f"[{host}]" if ":" in host else host, *hosts}
        if host in ("127.0.0.1", "::1"):
            names.add("localhost")
        self.hosts = {f"{name}:{port}" for name in names}

    def _signed(self, method: str, path: str) -> bool:
        return bool(self.secret) and not (method == "GET" and path == "/health")

    def refusal(self, method: str, path: str, headers: Message) -> str | None:
        """Why this request is not the web tier's (403), or None: judged on its head alone,
        before its body is read (the body's digest is signed; body_refusal checks it).
        NotTaken when its nonce cannot be remembered."""
        host = headers.get("Host") or ""
        if host not in self.hosts:
            return "this engine server answers only requests for its own address"
        if not self._signed(method, path):
            return None
        timestamp = headers.get(ENGINE_TIMESTAMP_HEADER) or ""
        nonce = headers.get(ENGINE_NONCE_HEADER) or ""
        # int() takes any script's digits, a sign and spaces: only ASCII digits are a time.
        if not (timestamp.isascii() and timestamp.isdigit()) or not nonce \
                or abs(time.time() - int(timestamp)) > ENGINE_SIGNATURE_SECONDS:
            return UNSIGNED_DETAIL
        expected = engine_signature(
            self.secret, method=method, host=host, path=path, timestamp=timestamp,
            nonce=nonce, timeout_ms=headers.get(ENGINE_TIMEOUT_HEADER) or "",
            body_digest=headers.get(ENGINE_BODY_DIGEST_HEADER) or "")
        signature = headers.get(ENGINE_SIGNATURE_HEADER) or ""
        if not hmac.compare_digest(_latin1(signature), expected.encode()):
            return UNSIGNED_DETAIL
        # Remembered only once the signature holds: unsigned requests cannot fill the cache.
        if not self.nonces.first_use(nonce, lapses=int(timestamp) + ENGINE_SIGNATURE_SECONDS
                                     + 1):
            return REPLAYED_DETAIL
        return None

    def body_refusal(self, method: str, path: str, body: bytes,
                     headers: Message) -> str | None:
        """Why this body is not the one the web tier signed (403), or None."""
        if not self._signed(method, path):
            return None
        digest = hashlib.sha256(body).hexdigest().encode()
        if not hmac.compare_digest(_latin1(headers.get(ENGINE_BODY_DIGEST_HEADER) or ""),
                                   digest):
            return UNSIGNED_DETAIL
        return None

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"

    def answer(self, method: str, path: str, body: bytes,
               headers: Message) -> tuple[int, dict[str, Any]]:
        """The answer to a request whose head was not refused (refusal), its body read."""
        refusal = self.body_refusal(method, path, body, headers)
        if refusal is not None:
            return 403, {"detail": refusal}
        timeout_ms = headers.get(ENGINE_TIMEOUT_HEADER)
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
            rows = model.kind.realtime_rows(request)
            deadline = None
            if timeout_ms is not None:
                if not (timeout_ms.isascii() and timeout_ms.isdigit()):
                    raise ValueError(f"{ENGINE_TIMEOUT_HEADER} must be a number of "
                                     "milliseconds")
                deadline = time.monotonic() + int(timeout_ms) / 1000
            return 200, model.kind.realtime_reply(model.batcher.submit(rows, deadline))
        except ValueError as exc:
            return 400, {"detail": str(exc)}
        except NotTaken as exc:
            return 503, {"detail": str(exc)}
        except BatchFailed as exc:
            return 500, {"detail": f"the engine failed: {exc}"}


class _DeadlineReader(io.RawIOBase):
    """A connection's bytes as its handler reads them: waiting at most the server's idle
    time for a request's first byte, then the rest of its head and body within the
    server's read time of it (a socket timeout alone bounds each read, not a client that
    sends a byte at a time)."""

    def __init__(self, sock: socket.socket, *, idle: float, whole: float) -> None:
        self.sock = sock
        self.idle = idle
        self.whole = whole
        self.deadline: float | None = None  # set by a request's first byte

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        if self.deadline is None:
            self.sock.settimeout(self.idle)
        else:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("the request did not arrive in time")
            self.sock.settimeout(left)
        read = self.sock.recv_into(buffer)
        if read and self.deadline is None:
            self.deadline = time.monotonic() + self.whole
        return read

    def request_read(self) -> None:
        """The request is in: the next one's time starts at its first byte, and writing
        the answer waits on the socket at most the idle time."""
        self.deadline = None
        self.sock.settimeout(self.idle)


class _Handler(BaseHTTPRequestHandler):
    server: EngineServer
    protocol_version = "HTTP/1.1"  # keep-alive: the web tier pools its connections
    disable_nagle_algorithm = True

    def setup(self) -> None:
        super().setup()
        self.rfile.close()  # the plain reader setup made: replaced by the deadline's
        # Every read of the request (BaseHTTPRequestHandler's head, _serve's body) goes
        # through the deadline; a read past it is TimeoutError, which handle_one_request
        # takes as "Request timed out" and closes the connection.
        self.reader = _DeadlineReader(self.connection, idle=self.server.idle_seconds,
                                      whole=self.server.read_seconds)
        self.rfile = io.BufferedReader(self.reader)

    def _serve(self) -> None:
        value = self.headers.get("Content-Length") or "0"
        length = int(value) if value.isascii() and value.isdigit() else -1
        if not 0 <= length <= MAX_BODY_BYTES:
            status, out = 400, {"detail": "a Content-Length up to 26 MiB is needed"}
            self.close_connection = True
        elif (refused := self._head_refused()) is not None:
            # The body is never read: a request that is not the web tier's costs its head,
            # and its connection, out of step with the stream, is closed.
            status, out = refused
            self.close_connection = True
        else:
            body = self.rfile.read(length) if length else b""
            if len(body) != length:  # the client closed the connection mid-body
                self.close_connection = True
                return
            status, out = self.server.answer(self.command, self.path, body, self.headers)
        self.reader.request_read()
        payload = json.dumps(out, separators=(",", ":")).encode()
        head = [f"HTTP/1.1 {status} {self.responses.get(status, ('',))[0]}",
                "Content-Type: application/json", f"Content-Length: {len(payload)}"]
        if status == 503:
            head.append(f"Retry-After: {RETRY_AFTER_SECONDS}")
        if self.close_connection:
            head.append("Connection: close")
        # Head and body in one write: no small packet waits on a delayed ACK.
        self.wfile.write(("\r\n".join(head) + "\r\n\r\n").encode() + payload)

    def _head_refused(self) -> tuple[int, dict[str, Any]] | None:
        """The answer to a request refused on its head (403; 503 when its nonce cannot be
        remembered), or None."""
        try:
            refusal = self.server.refusal(self.command, self.path, self.headers)
        except NotTaken as exc:
            return 503, {"detail": str(exc)}
        return None if refusal is None else (403, {"detail": refusal})

    do_GET = _serve
    do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:
        pass  # the web tier logs the requests; texts never reach a log here
