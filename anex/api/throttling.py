"""Per-key request rate limit, and per-client invalid-key limit (docs/decisions.md,
"Adopted from the peer API").

Fixed one-minute windows counted in Redis, so every web process shares the count. When
Redis cannot be reached the request is let through: a limiter outage must not take the
API down with it.

A request with an invalid key has no key to count against, so its client (the address it
comes from) is counted instead: past INVALID_KEYS_PER_MINUTE in a window, the client's
requests are answered 429 before any key is looked up, until the window ends.
"""

from __future__ import annotations

import logging
import math
import time
from typing import TYPE_CHECKING

import redis
from django.conf import settings
from django.http import HttpRequest
from rest_framework.throttling import BaseThrottle

from anex.api.errors import ApiError
from anex.redis import redis_client
from console.models import ApiKey

if TYPE_CHECKING:
    # DRF imports this module while rest_framework.views is still loading.
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)
WINDOW_SECONDS = 60
# A client that sends a valid key gets this wrong rarely (a rotated key in one deploy);
# a flood of guessed or revoked keys is held to it.
INVALID_KEYS_PER_MINUTE = 60
INVALID_KEYS_DETAIL = (
    "Too many requests with an invalid API key from this address. Wait the seconds in the "
    "Retry-After header, then retry with a valid key."
)


class ApiKeyRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        key = request.auth
        if not isinstance(key, ApiKey):
            return True
        limit = key.rate_limit_per_minute or settings.ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE
        now = time.time()
        window = int(now // WINDOW_SECONDS)
        counter = f"anex:ratelimit:{key.pk}:{window}"
        try:
            pipe = redis_client().pipeline()
            pipe.incr(counter)
            pipe.expire(counter, WINDOW_SECONDS * 2)
            count, _ = pipe.execute()
        except redis.RedisError as exc:
            logger.warning("rate limiter unavailable, request allowed: %s", exc)
            return True
        if int(count) <= limit:
            return True
        self._wait = (window + 1) * WINDOW_SECONDS - now
        return False

    def wait(self) -> float | None:
        return self._wait


def client_address(request: HttpRequest | Request) -> str:
    """The client's address: the peer, or behind ANEX_TRUSTED_PROXY_COUNT proxies the
    address the outermost trusted one saw (a client can prepend any X-Forwarded-For)."""
    proxies: int = getattr(settings, "ANEX_TRUSTED_PROXY_COUNT", 0)
    if proxies:
        hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",")
                if hop.strip()]
        if len(hops) >= proxies:
            return hops[-proxies]
    return str(request.META.get("REMOTE_ADDR", ""))


def _invalid_key_counter(request: HttpRequest | Request) -> tuple[str, float]:
    """This client's counter for the current window, and the seconds the window has left."""
    now = time.time()
    window = int(now // WINDOW_SECONDS)
    return (f"anex:invalid-keys:{client_address(request)}:{window}",
            (window + 1) * WINDOW_SECONDS - now)


def invalid_keys_check(request: HttpRequest | Request) -> None:
    """429 when this client has sent INVALID_KEYS_PER_MINUTE invalid keys this window
    (called once its key was not found)."""
    counter, left = _invalid_key_counter(request)
    try:
        count = redis_client().get(counter)
    except redis.RedisError as exc:
        logger.warning("invalid-key limiter unavailable, request allowed: %s", exc)
        return
    if count is not None and int(count) >= INVALID_KEYS_PER_MINUTE:
        raise ApiError(
            429, INVALID_KEYS_DETAIL, retry_after=max(1, math.ceil(left)),
            extra={"error": {"code": "rate_limit_exceeded", "message": INVALID_KEYS_DETAIL}})


def invalid_key_record(request: HttpRequest | Request) -> None:
    """Count one invalid key against this client."""
    counter, _left = _invalid_key_counter(request)
    try:
        pipe = redis_client().pipeline()
        pipe.incr(counter)
        pipe.expire(counter, WINDOW_SECONDS * 2)
        pipe.execute()
    except redis.RedisError as exc:
        logger.warning("invalid-key limiter unavailable, not counted: %s", exc)
