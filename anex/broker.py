"""The Dramatiq broker: Redis, namespaced, with database connection hygiene."""

from __future__ import annotations

import dramatiq
from django.conf import settings
from django.db import close_old_connections, connections
from dramatiq.broker import MessageProxy
from dramatiq.brokers.redis import RedisBroker

NAMESPACE = "anex"


class DbConnectionsMiddleware(dramatiq.Middleware):
    """Drop database connections that died or outlived CONN_MAX_AGE around each message,
    the way Django's request_started/finished signals do for requests."""

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        close_old_connections()

    def after_process_message(self, broker: dramatiq.Broker, message: MessageProxy,
                              *, result: object = None,
                              exception: BaseException | None = None) -> None:
        close_old_connections()

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        close_old_connections()

    def before_worker_thread_shutdown(self, broker: dramatiq.Broker, thread: object) -> None:
        # Runs in the stopping thread: close its connections rather than leak them.
        connections.close_all()


def broker_setup() -> dramatiq.Broker:
    broker = RedisBroker(url=settings.REDIS_URL, namespace=NAMESPACE)
    broker.add_middleware(DbConnectionsMiddleware())
    dramatiq.set_broker(broker)
    return broker
