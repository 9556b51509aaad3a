"""GET /healthz: can this process reach its database and its broker?"""

from __future__ import annotations

import logging

import redis
from django.conf import settings
from django.db import DatabaseError, connection
from django.http import HttpRequest, JsonResponse
from django.views.decorators.http import require_GET

logger = logging.getLogger(__name__)
CHECK_TIMEOUT_SECONDS = 2


def database_reachable() -> bool:
    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT 1")
            return cursor.fetchone() == (1,)
    except DatabaseError as exc:
        logger.warning("healthz: database unreachable: %s", exc.__class__.__name__)
        return False


def broker_reachable() -> bool:
    client = redis.Redis.from_url(
        settings.REDIS_URL,
        socket_connect_timeout=CHECK_TIMEOUT_SECONDS,
        socket_timeout=CHECK_TIMEOUT_SECONDS,
    )
    try:
        return bool(client.ping())
    except redis.RedisError as exc:
        logger.warning("healthz: broker unreachable: %s", exc.__class__.__name__)
        return False
    finally:
        client.close()


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    checks = {
        "database": "ok" if database_reachable() else "unreachable",
        "broker": "ok" if broker_reachable() else "unreachable",
    }
    healthy = all(state == "ok" for state in checks.values())
    response = JsonResponse({"status": "ok" if healthy else "unavailable", **checks},
                            status=200 if healthy else 503)
    if not healthy:
        response["Retry-After"] = str(settings.ANEX_RETRY_AFTER_SECONDS)
    response["Cache-Control"] = "no-store"
    return response
