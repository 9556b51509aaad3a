"""One Redis client per process for the web tier's own use (rate limits, locks)."""

from __future__ import annotations

from functools import cache

import redis
from django.conf import settings


@cache
def _client_for(url: str) -> redis.Redis:
    return redis.Redis.from_url(url, socket_connect_timeout=2, socket_timeout=2)


def redis_client() -> redis.Redis:
    return _client_for(settings.REDIS_URL)
