"""The web tier's side of the realtime engine servers: one pooled keep-alive connection set
per engine URL per process, so a request costs a round trip on loopback, not a connect.

Every request is signed with the secret the web tier shares with its engine servers
(ANEX_REALTIME_ENGINE_SECRET: an HMAC-SHA256 of a timestamp, the path and the body), so an
engine server answers no one else, and carries its deadline (ENGINE_TIMEOUT_HEADER). A
model with several engine servers sends each request to the next in turn."""

from __future__ import annotations

import hashlib
import hmac
import itertools
import json
import logging
import threading
import time
from typing import Any

import urllib3
from django.conf import settings

from realtime.constants import (
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
# Failures of a connection before the engine read the request: retried once.
_RETRIED = (urllib3.exceptions.ProtocolError, urllib3.exceptions.NewConnectionError,
            urllib3.exceptions.ConnectTimeoutError)

_pools: dict[str, urllib3.HTTPConnectionPool] = {}
_turns = itertools.count()  # which of a model's engines the next request goes to
_lock = threading.Lock()


class EngineUnavailable(Exception):
    """The engine did not answer, or answered with a failure: the request gets a 502."""


class EngineRefused(Exception):
    """The engine server refused what it was sent (a 4xx): a bug on our side or a model it
    does not serve, never the customer's input, which is checked before it is sent."""


class EngineBusy(Exception):
    """The engine did not take the request (its queue is full, or the request's deadline
    passed while it waited): nothing was computed, the request gets a 503."""


class EngineTimedOut(Exception):
    """The engine took the request but did not answer in time: it did the work (it takes
    work only before the request's deadline, DEADLINE_MARGIN_SECONDS before this)."""


def _pool(url: str) -> urllib3.HTTPConnectionPool:
    with _lock:
        pool = _pools.get(url)
        if pool is None:
            # No retries of urllib3's own: a read that timed out must not send the work
            # again (engine_call retries only a connection that failed before it was used).
            pool = _pools[url] = urllib3.connection_from_url(
                url, maxsize=POOL_CONNECTIONS, block=False, retries=False,
                headers={"Content-Type": "application/json"})
        return pool


def deadline_seconds() -> float:
    """How long the engine may wait before it takes a request: a margin before the web tier
    stops waiting, so work it takes has time to be answered."""
    timeout = float(settings.ANEX_REALTIME_TIMEOUT_SECONDS)
    return max(timeout - DEADLINE_MARGIN_SECONDS, timeout / 2)


def engine_signature(secret: str, *, timestamp: str, path: str, body: bytes) -> str:
    """The HMAC-SHA256 of a request to an engine server (realtime/serving.py checks it)."""
    message = b"\n".join((timestamp.encode(), path.encode(), body))
    return hmac.new(secret.encode(), message, hashlib.sha256).hexdigest()


def engine_call(*, urls: tuple[str, ...], path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST body to one of the engine servers at urls (the next in turn, then the others
    while one cannot be connected to); its JSON answer."""
    timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_SECONDS,
                              read=settings.ANEX_REALTIME_TIMEOUT_SECONDS)
    payload = json.dumps(body, ensure_ascii=False).encode()
    headers = {"Content-Type": "application/json",
               ENGINE_TIMEOUT_HEADER: str(int(deadline_seconds() * 1000))}
    secret = settings.ANEX_REALTIME_ENGINE_SECRET
    if secret:
        timestamp = str(int(time.time()))
        headers[ENGINE_TIMESTAMP_HEADER] = timestamp
        headers[ENGINE_SIGNATURE_HEADER] = engine_signature(secret, timestamp=timestamp,
                                                            path=path, body=payload)
    first = next(_turns)
    order = [urls[(first + step) % len(urls)] for step in range(len(urls))]
    attempts = [order[0], *order]  # the first twice: a connection it closed in the pool
    for attempt, url in enumerate(attempts):
        try:
            response = _pool(url).urlopen("POST", path, body=payload, headers=headers,
                                          timeout=timeout, preload_content=True)
            break
        except urllib3.exceptions.ReadTimeoutError:
            logger.warning("realtime engine at %s took a request and did not answer in "
                           "time", url)
            raise EngineTimedOut(url) from None
        except urllib3.exceptions.HTTPError as exc:
            # Retried on a failure before the engine read the request: a pooled connection
            # it closed (or a restarted engine), once, then each other engine in turn.
            if attempt + 1 < len(attempts) and isinstance(exc, _RETRIED):
                continue
            logger.warning("realtime engine at %s did not answer: %s", url,
                           exc.__class__.__name__)
            raise EngineUnavailable(exc.__class__.__name__) from None
    try:
        answer = json.loads(response.data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise EngineUnavailable(f"status {response.status}, not a JSON object")
    if response.status == 503:
        raise EngineBusy(str(answer.get("detail")))
    if response.status >= 500:
        raise EngineUnavailable(str(answer.get("detail", response.status)))
    if response.status != 200:
        raise EngineRefused(f"status {response.status}: {answer.get('detail')}")
    return answer
