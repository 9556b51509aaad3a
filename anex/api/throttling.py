"""Per-key request rate limit, and per-client invalid-key limit
(docs/dev/decisions/2026-12-01-adopted-from-the-peer-api.md).

Fixed one-minute windows counted in Redis, so every web process shares the count. When
Redis cannot be reached all three fail open
(docs/dev/decisions/2026-12-02-limiters-when-redis-fails.md): a limiter outage must not take the API
down with it; credits and budgets, in PostgreSQL, still bound what a key can spend, and a key's 238
random bits, not the invalid-key count, are what keep it from being guessed.

A request with an invalid key has no key to count against, so its client (the address it
comes from) is counted instead once its key was not found: past INVALID_KEYS_PER_MINUTE
in a window, the client's invalid keys are answered 429 rather than 401 until the window
ends.
"""

from __future__ import annotations

import logging
import math
from typing import TYPE_CHECKING

from django.conf import settings
from django.http import HttpRequest
from rest_framework.throttling import BaseThrottle

from anex.errors import RateLimited
from anex.redis import window_hit, windows_hit
from console.models import ApiKey

if TYPE_CHECKING:
    # DRF imports this module while rest_framework.views is still loading.
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)
RATE_LIMITER = "ratelimit"  # the per-key request counters
# An organization's keys together: past ANEX_ORG_RATE_LIMIT_PER_MINUTE in a window, 429
# whichever of its keys sent it, so creating more keys does not buy more rate.
ORGANIZATION_RATE_LIMITER = "ratelimit-org"
# A client that sends a valid key gets this wrong rarely (a rotated key in one deploy);
# a flood of guessed or revoked keys is held to it.
INVALID_KEYS_PER_MINUTE = 60
INVALID_KEYS_DETAIL = (
    "Too many requests with an invalid API key from this address. Wait the seconds in the "
    "Retry-After header, then retry with a valid key."
)


def key_rate_limit(key: ApiKey) -> int:
    """The requests a minute this key may send."""
    return key.rate_limit_per_minute or settings.ANEX_DEFAULT_RATE_LIMIT_PER_MINUTE


class ApiKeyRateThrottle(BaseThrottle):
    def __init__(self) -> None:
        self._wait: float | None = None

    def allow_request(self, request: Request, view: APIView) -> bool:
        key = request.auth
        if not isinstance(key, ApiKey):
            return True
        # The key's rate and its organization's, counted in one round trip (a request
        # refused by its key's limit still counts against the organization: it was sent).
        hits = windows_hit([(RATE_LIMITER, key.pk), (ORGANIZATION_RATE_LIMITER,
                                                       key.organization_id)], fail="open")
        if hits is None:
            return True
        key_hit, organization_hit = hits
        if key_hit.count > key_rate_limit(key):
            self._wait = key_hit.seconds_left
            return False
        limit = settings.ANEX_ORG_RATE_LIMIT_PER_MINUTE
        if organization_hit.count > limit:
            raise RateLimited(ORGANIZATION_RATE_DETAIL.format(limit=limit),
                              retry_after=max(1, math.ceil(organization_hit.seconds_left)),
                              code="rate_limit_exceeded")
        return True

    def wait(self) -> float | None:
        return self._wait


ORGANIZATION_RATE_DETAIL = (
    "Too many requests: this organization's API keys together are sending requests faster "
    "than its limit of {limit} a minute. Wait the seconds in the Retry-After header, then "
    "retry.")


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


def invalid_key_count(request: HttpRequest | Request) -> None:
    """Count one invalid key against this client (called once its key was not found); 429
    once the client has sent INVALID_KEYS_PER_MINUTE of them this window."""
    hit = window_hit("invalid-keys", client_address(request), fail="open")
    if hit is not None and hit.count > INVALID_KEYS_PER_MINUTE:
        raise RateLimited(INVALID_KEYS_DETAIL, retry_after=max(1, math.ceil(hit.seconds_left)),
                          code="rate_limit_exceeded")
