"""Per-key request rate limit (docs/decisions.md, "Adopted from the peer API").

A fixed one-minute window counted in Redis, so every web process shares the count. When
Redis cannot be reached the request is let through: a limiter outage must not take the
API down with it.
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

import redis
from django.conf import settings
from rest_framework.throttling import BaseThrottle

from anex.redis import redis_client
from console.models import ApiKey

if TYPE_CHECKING:
    # DRF imports this module while rest_framework.views is still loading.
    from rest_framework.request import Request
    from rest_framework.views import APIView

logger = logging.getLogger(__name__)
WINDOW_SECONDS = 60


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
