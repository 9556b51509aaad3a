"""The web role's gunicorn hooks and worker (anex.roles: `--config python:anex.gunicorn_hooks`,
`--worker-class anex.gunicorn_hooks.BoundedThreadWorker`).

The worker is gunicorn's threaded one with every connection's socket bounded (issue 40 M2;
docs/dev/decisions/2026-12-06-slow-clients-and-the-web-tier.md): gunicorn waits for a connection's
first bytes without a thread, but once they come it reads the rest of the request line, the
headers and (through the application) the body with blocking reads that never time out, so
a client that sends a few bytes and stops held a thread for good, and a handful held a
process. Here each read and write waits at most ANEX_WEB_SOCKET_TIMEOUT_SECONDS, and a
request may set a deadline for all its reads (anex.api.bodylimit.body_deadline); past
either the read fails, the request is answered 408 (or the connection closed, mid-headers)
and the thread is free. A proxy in front (compose.yaml's nginx, docs/deploy.md) buffers
slow clients without a thread at all; this bound holds without one.

Once a worker has loaded the application, and before its first request, it loads what its
requests would otherwise load on the way (the URLconf with every view module; the
tokenizer and chat template of each local checkpoint, which realtime counts with, and
transformers with them), collects the garbage, and moves what is left out of the
collector's reach (gc.freeze): some 205,000 objects that live as long as the process.
Without that, each full collection walked them all with every thread of the process
stopped, for hundreds of milliseconds under load every few seconds, and a job read that
met one waited it out (docs/dev/decisions/2026-12-02-the-web-processs-heap.md). What
requests make later is collected as before.
"""

from __future__ import annotations

import gc
import logging
import socket
import time
from typing import Any

from gunicorn.workers.gthread import ThreadWorker

logger = logging.getLogger(__name__)


def heap_freeze() -> None:
    from django.conf import settings
    from django.urls import get_resolver

    from inference.tokens import token_counter

    get_resolver().url_patterns  # noqa: B018  (imports every view module)
    for model_id in settings.ANEX_CHECKPOINTS:
        try:
            token_counter(model_id)
        except Exception as exc:  # the first request that counts with it says so again
            logger.warning("the tokenizer of %s could not be loaded: %s", model_id,
                           type(exc).__name__)
    gc.collect()
    gc.freeze()
    logger.info("web worker ready: %d objects frozen", gc.get_freeze_count())


def post_worker_init(worker: Any) -> None:
    heap_freeze()


class BoundedSocket(socket.socket):
    """A connection's socket that never blocks without a bound: blocking mode (which
    gunicorn sets around its own reads) is a timeout of `bound` seconds, and with a
    deadline set (deadline_set, a time.monotonic() value) each read waits at most until it,
    so a body read byte by byte cannot outlast it either. A read past either raises
    TimeoutError (an OSError: Django's UnreadablePostError in the application)."""

    __slots__ = ("_bound", "_deadline")
    _bound: float
    _deadline: float | None

    @classmethod
    def around(cls, connection: socket.socket, bound: float) -> BoundedSocket:
        """The same connection (its descriptor handed over) as a BoundedSocket."""
        bounded = cls(connection.family, connection.type, connection.proto,
                      fileno=connection.detach())
        bounded._bound = bound
        bounded._deadline = None
        bounded.settimeout(None)
        return bounded

    def setblocking(self, flag: bool) -> None:
        self.settimeout(None if flag else 0.0)

    def settimeout(self, value: float | None) -> None:
        bound = getattr(self, "_bound", None)
        if bound is not None and (value is None or value > bound):
            value = bound  # blocking, or longer than the bound: the bound
        super().settimeout(value)

    def deadline_set(self, deadline: float | None) -> None:
        self._deadline = deadline
        if deadline is None:
            self.settimeout(None)

    def _deadline_apply(self) -> None:
        if self._deadline is None:
            return
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive before its deadline")
        current = self.gettimeout()
        if current is None or current > left:
            super().settimeout(left)

    def recv(self, bufsize: int, flags: int = 0) -> bytes:
        self._deadline_apply()
        return super().recv(bufsize, flags)

    def recv_into(self, buffer: Any, nbytes: int = 0, flags: int = 0) -> int:
        self._deadline_apply()
        return super().recv_into(buffer, nbytes, flags)


class BoundedThreadWorker(ThreadWorker):  # type: ignore[misc]
    """gunicorn's gthread worker, each connection's socket a BoundedSocket."""

    socket_timeout: float | None = None

    def handle(self, conn: Any) -> Any:
        if not isinstance(conn.sock, BoundedSocket):
            conn.sock = BoundedSocket.around(conn.sock, self._socket_timeout())
        return super().handle(conn)

    def _socket_timeout(self) -> float:
        if self.socket_timeout is None:
            from django.conf import settings  # configured: the application is loaded

            self.socket_timeout = float(settings.ANEX_WEB_SOCKET_TIMEOUT_SECONDS)
        return self.socket_timeout


class ClientTimeoutLogFilter(logging.Filter):
    """gunicorn logs a client its socket timeout cut off mid-headers as an error with a
    traceback ("Socket error processing request."): routine here (a slow or stalled
    client), so one line at INFO instead."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        if isinstance(error, TimeoutError):
            record.msg, record.args, record.exc_info = (
                "a client stopped sending within the socket timeout: connection closed",
                (), None)
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def post_fork(server: Any, worker: Any) -> None:
    logging.getLogger("gunicorn.error").addFilter(ClientTimeoutLogFilter())
