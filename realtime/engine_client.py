"""The web tier's side of the realtime engine servers: one pooled keep-alive connection set
per engine URL per process, so a request costs a round trip on loopback, not a connect."""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

import urllib3
from django.conf import settings

logger = logging.getLogger(__name__)

# A web process serves as many requests at once as it has threads; each keeps at most one
# connection, and a burst beyond it opens (and then drops) extra ones rather than waiting.
POOL_CONNECTIONS = 64
CONNECT_TIMEOUT_SECONDS = 2.0

_pools: dict[str, urllib3.HTTPConnectionPool] = {}
_lock = threading.Lock()


class EngineUnavailable(Exception):
    """The engine did not answer, or answered with a failure: the request gets a 502."""


class EngineRefused(Exception):
    """The engine server refused what it was sent (a 4xx): a bug on our side or a model it
    does not serve, never the customer's input, which is checked before it is sent."""


def _pool(url: str) -> urllib3.HTTPConnectionPool:
    with _lock:
        pool = _pools.get(url)
        if pool is None:
            # One retry, on a connection the engine closed while it sat in the pool (or a
            # restarted engine): both calls are pure functions of their body, safe to repeat.
            pool = _pools[url] = urllib3.connection_from_url(
                url, maxsize=POOL_CONNECTIONS, block=False,
                retries=urllib3.Retry(total=1, connect=1, read=1, status=0, redirect=0,
                                      other=0, allowed_methods=None),
                headers={"Content-Type": "application/json"})
        return pool


def engine_call(*, url: str, path: str, body: dict[str, Any]) -> dict[str, Any]:
    """POST body to the engine server at url; its JSON answer."""
    timeout = urllib3.Timeout(connect=CONNECT_TIMEOUT_SECONDS,
                              read=settings.ANEX_REALTIME_TIMEOUT_SECONDS)
    try:
        response = _pool(url).urlopen(
            "POST", path, body=json.dumps(body, ensure_ascii=False).encode(),
            timeout=timeout, preload_content=True)
    except urllib3.exceptions.HTTPError as exc:
        logger.warning("realtime engine at %s did not answer: %s", url,
                       exc.__class__.__name__)
        raise EngineUnavailable(exc.__class__.__name__) from None
    try:
        answer = json.loads(response.data)
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise EngineUnavailable(f"status {response.status}, not a JSON object")
    if response.status >= 500:
        raise EngineUnavailable(str(answer.get("detail", response.status)))
    if response.status != 200:
        raise EngineRefused(f"status {response.status}: {answer.get('detail')}")
    return answer
