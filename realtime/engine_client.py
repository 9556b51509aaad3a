"""The web tier's side of the realtime engine servers: one set of keep-alive connections per
engine URL per process, so a request costs a round trip on loopback, not a connect.

Every request is signed with the secret the web tier shares with its engine servers
(ANEX_REALTIME_ENGINE_SECRET: an HMAC-SHA256 of its method, Host, path, timestamp, a nonce,
its deadline header and its body's SHA-256, engine_signature), so an engine server answers
no one else, checks it all before it reads the body, and answers each signed request once.
Each request carries its deadline (ENGINE_TIMEOUT_HEADER). A model with several engine
servers sends each request to the next in turn.

The client is this module's own, on a socket: an engine server (realtime/serving.py) speaks
one HTTP/1.1 dialect, a JSON answer with its Content-Length in one write, and a request is
one write of its head and body and one read of the answer. urllib3 did the same for about
three times the CPU (bench/RESULTS.md, "Realtime web tier CPU"), for what the engine
servers never send (chunked bodies, redirects, compression). The failures are urllib3's,
kept: a connection that fails before the engine answered anything (refused, reset, closed
while pooled) is retried, once on the same engine, then on each other; a read that times
out is the engine's work done and not answered (EngineTimedOut)."""

from __future__ import annotations

import functools
import hashlib
import hmac
import itertools
import json
import logging
import secrets
import select
import socket
import ssl
import threading
import time
from dataclasses import dataclass
from typing import Any, BinaryIO
from urllib.parse import urlsplit

from django.conf import settings

from realtime.constants import (
    ENGINE_BODY_DIGEST_HEADER,
    ENGINE_NONCE_HEADER,
    ENGINE_SIGNATURE_HEADER,
    ENGINE_TIMEOUT_HEADER,
    ENGINE_TIMESTAMP_HEADER,
)

logger = logging.getLogger(__name__)

# A web process serves as many requests at once as it has threads; each keeps at most one
# connection, and a burst beyond it opens (and then drops) extra ones rather than waiting.
POOL_CONNECTIONS = 64
CONNECT_TIMEOUT_SECONDS = 2.0
# The engine takes a request only this long before the web tier would stop waiting for it
# (deadline_seconds): what it takes, it has that long to answer.
DEADLINE_MARGIN_SECONDS = 5.0
# An engine server's answer head is a status line and three or four short headers.
MAX_HEAD_LINE_BYTES = 8192
MAX_HEAD_LINES = 64
DEFAULT_PORTS = {"http": 80, "https": 443}

_idle: dict[str, list[_Connection]] = {}  # each URL's connections not in use
_turns = itertools.count()  # which of a model's engines the next request goes to
_lock = threading.Lock()
_tls: ssl.SSLContext | None = None


class EngineUnavailable(Exception):
    """The engine did not answer, or answered with a failure: the request gets a 502."""


class EngineRefused(Exception):
    """The engine server refused what it was sent (a 4xx): a bug on our side or a model it
    does not serve, never the customer's input, which is checked before it is sent."""


class EngineAtCapacity(Exception):
    """The engine did not take the request (its queue is full, or the request's deadline
    passed while it waited: realtime.serving NotTaken): nothing was computed, the request
    gets a 503."""


class EngineTimedOut(Exception):
    """The engine took the request but did not answer in time: it did the work (it takes
    work only before the request's deadline, DEADLINE_MARGIN_SECONDS before this)."""


class _Broken(Exception):
    """The connection failed before the engine answered anything (refused, reset, closed
    while it was pooled, a partial answer): the request may be sent again."""


@dataclass(frozen=True)
class _Address:
    scheme: str
    host: str
    port: int
    host_header: str  # as urllib3 sent it: the port named unless it is the scheme's own


@functools.lru_cache(maxsize=256)
def _address(url: str) -> _Address:
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or DEFAULT_PORTS.get(parts.scheme, 80)
    name = f"[{host}]" if ":" in host else host
    header = name if port == DEFAULT_PORTS.get(parts.scheme) else f"{name}:{port}"
    return _Address(scheme=parts.scheme, host=host, port=port, host_header=header)


def _tls_context() -> ssl.SSLContext:
    global _tls
    if _tls is None:
        _tls = ssl.create_default_context()  # the system's CAs, the name checked
    return _tls


class _Connection:
    """One keep-alive connection to an engine server."""

    def __init__(self, address: _Address) -> None:
        try:
            sock = socket.create_connection((address.host, address.port),
                                            timeout=CONNECT_TIMEOUT_SECONDS)
        except OSError as exc:  # refused, unreachable, or the connect timed out
            raise _Broken(exc.__class__.__name__) from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if address.scheme == "https":
            try:
                sock = _tls_context().wrap_socket(sock, server_hostname=address.host)
            except TimeoutError:  # a handshake that timed out: as a connect that did
                sock.close()
                raise _Broken("the TLS handshake timed out") from None
            except OSError:  # a certificate refused: not tried again
                sock.close()
                raise
        self.sock = sock
        self.reader: BinaryIO = sock.makefile("rb")

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def exchange(self, request: bytes, timeout: float) -> tuple[int, bytes, bool]:
        """Send one request, read its answer: the status, the body, and whether the
        connection may carry another. _Broken before any of the answer arrived or for a
        partial one; TimeoutError when the engine took the request and did not answer;
        ConnectionError when the request could not be sent within the timeout."""
        self.sock.settimeout(timeout)
        try:
            self.sock.sendall(request)
        except TimeoutError:
            # Not all of it reached the engine, which computes nothing before it has the
            # whole body: a 502 billed nothing, not sent again (that would wait as long).
            raise ConnectionError("the request could not be sent in time") from None
        except OSError as exc:
            raise _Broken(exc.__class__.__name__) from None
        try:
            status_line = self.reader.readline(MAX_HEAD_LINE_BYTES)
            version, _, rest = status_line.partition(b" ")
            if not version.startswith(b"HTTP/1.") or not rest[:3].isdigit():
                raise _Broken("closed" if not status_line else "not an HTTP answer")
            length, keep = None, version == b"HTTP/1.1"
            for _ in range(MAX_HEAD_LINES):
                line = self.reader.readline(MAX_HEAD_LINE_BYTES)
                if line in (b"\r\n", b"\n"):
                    break
                if not line.endswith(b"\n"):
                    raise _Broken("a partial head")
                name, _, value = line.partition(b":")
                name = name.strip().lower()
                if name == b"content-length":
                    length = int(value)
                elif name == b"connection" and value.strip().lower() == b"close":
                    keep = False
            else:
                raise _Broken("a head too long")
            if length is None or length < 0:
                raise _Broken("an answer without its Content-Length")
            body = self.reader.read(length)
            if len(body) != length:
                raise _Broken("a partial answer")
            return int(rest[:3]), body, keep
        except TimeoutError:
            raise
        except ValueError:
            raise _Broken("a malformed head") from None
        except OSError as exc:
            raise _Broken(exc.__class__.__name__) from None


def _checkout(url: str) -> _Connection:
    """A pooled connection to url that the engine has not closed, or a new one. An idle
    connection with something to read has been closed by its engine (a restart), as
    urllib3 checks it too: dropped here rather than failing the request's first try."""
    while True:
        with _lock:
            idle = _idle.get(url)
            connection = idle.pop() if idle else None
        if connection is None:
            return _Connection(_address(url))
        if not _readable(connection.sock):
            return connection
        connection.close()


def _readable(sock: socket.socket) -> bool:
    poller = select.poll()  # not select(): a busy process's descriptors pass 1,024
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(0))


def _checkin(url: str, connection: _Connection) -> None:
    with _lock:
        idle = _idle.setdefault(url, [])
        if len(idle) < POOL_CONNECTIONS:
            idle.append(connection)
            return
    connection.close()


def _head(url: str, path: str, headers: dict[str, str], length: int) -> bytes:
    lines = [f"POST {path} HTTP/1.1", f"Host: {_address(url).host_header}",
             *(f"{name}: {value}" for name, value in headers.items()),
             f"Content-Length: {length}", "", ""]
    return "\r\n".join(lines).encode("latin-1")


def deadline_seconds() -> float:
    """How long the engine may wait before it takes a request: a margin before the web tier
    stops waiting, so work it takes has time to be answered."""
    timeout = float(settings.ANEX_REALTIME_TIMEOUT_SECONDS)
    return max(timeout - DEADLINE_MARGIN_SECONDS, timeout / 2)


def engine_signature(secret: str, *, method: str, host: str, path: str, timestamp: str,
                     nonce: str, timeout_ms: str, body_digest: str) -> str:
    """The HMAC-SHA256 of a request to an engine server (realtime/serving.py checks it): of
    every header the server acts on, and of the body through its digest, so the server can
    check it before it reads the body. No field can carry a newline (an HTTP head cannot),
    so no two requests sign the same message."""
    message = "\n".join((method, host, path, timestamp, nonce, timeout_ms, body_digest))
    return hmac.new(secret.encode(), message.encode(), hashlib.sha256).hexdigest()


def engine_signed_headers(secret: str, *, host: str, path: str, timeout_ms: str,
                          body_digest: str) -> dict[str, str]:
    """The headers that sign a POST to an engine server, with a fresh timestamp and nonce
    (one set per request sent: the server answers a nonce once)."""
    timestamp = str(int(time.time()))
    nonce = secrets.token_hex(16)
    return {ENGINE_TIMESTAMP_HEADER: timestamp, ENGINE_NONCE_HEADER: nonce,
            ENGINE_BODY_DIGEST_HEADER: body_digest,
            ENGINE_SIGNATURE_HEADER: engine_signature(
                secret, method="POST", host=host, path=path, timestamp=timestamp,
                nonce=nonce, timeout_ms=timeout_ms, body_digest=body_digest)}


def engine_call(*, urls: tuple[str, ...], path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST body to one of the engine servers at urls (the next in turn, then the others
    while one cannot be connected to); its JSON answer."""
    timeout = float(settings.ANEX_REALTIME_TIMEOUT_SECONDS)
    payload = json.dumps(body, ensure_ascii=False).encode()
    timeout_ms = str(int(deadline_seconds() * 1000))
    headers = {"Content-Type": "application/json", ENGINE_TIMEOUT_HEADER: timeout_ms}
    secret = settings.ANEX_REALTIME_ENGINE_SECRET
    digest = hashlib.sha256(payload).hexdigest() if secret else ""
    first = next(_turns)
    order = [urls[(first + step) % len(urls)] for step in range(len(urls))]
    attempts = [order[0], *order]  # the first twice: a connection it closed in the pool
    for attempt, url in enumerate(attempts):
        connection = None
        signed = headers if not secret else {**headers, **engine_signed_headers(
            secret, host=_address(url).host_header, path=path, timeout_ms=timeout_ms,
            body_digest=digest)}
        try:
            connection = _checkout(url)
            status, data, keep = connection.exchange(
                _head(url, path, signed, len(payload)) + payload, timeout)
        except TimeoutError:  # connecting timeouts are _Broken: this is the answer's
            if connection is not None:
                connection.close()
            logger.warning("realtime engine at %s took a request and did not answer in "
                           "time", url)
            raise EngineTimedOut(url) from None
        except (_Broken, OSError) as exc:
            # Retried on a failure before the engine answered: a pooled connection it
            # closed (or a restarted engine), once, then each other engine in turn.
            if connection is not None:
                connection.close()
            if attempt + 1 < len(attempts) and isinstance(exc, _Broken):
                continue
            logger.warning("realtime engine at %s did not answer: %s", url,
                           exc.__class__.__name__)
            raise EngineUnavailable(exc.__class__.__name__) from None
        if keep:
            _checkin(url, connection)
        else:
            connection.close()
        break
    try:
        answer = json.loads(data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise EngineUnavailable(f"status {status}, not a JSON object")
    if status == 503:
        raise EngineAtCapacity(str(answer.get("detail")))
    if status >= 500:
        raise EngineUnavailable(str(answer.get("detail", status)))
    if status != 200:
        raise EngineRefused(f"status {status}: {answer.get('detail')}")
    return answer
