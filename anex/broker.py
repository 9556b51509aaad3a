"""The Dramatiq broker: Redis, namespaced, with a doorbell and database connection hygiene."""

from __future__ import annotations

import logging

import dramatiq
from django.conf import settings
from django.db import close_old_connections, connections
from dramatiq.broker import MessageProxy

from anex.internals.doorbell import DoorbellRedisBroker
from anex.logcontext import UNSET, log_context_clear
from anex.requestid import current_request_id

logger = logging.getLogger(__name__)

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


class RequestIdMiddleware(dramatiq.Middleware):
    """The request id travels with the work it causes
    (docs/dev/decisions/2026-12-02-logs-that-follow-a-job.md): a message sent while one is current
    (an API call, or an actor that itself runs for one) carries it in its options, and the worker
    that runs the message makes it current again around the actor, so the actor's log lines and the
    messages it sends in turn carry it too. Between messages a worker thread is about no request,
    job or chunk."""

    OPTION = "request_id"

    def before_enqueue(self, broker: dramatiq.Broker, message: dramatiq.Message[object],
                       delay: int | None) -> None:
        request_id = current_request_id.get()
        # A message re-enqueued (a retry, a delayed message coming due) keeps its own.
        if request_id != UNSET and self.OPTION not in message.options:
            message.options[self.OPTION] = request_id

    def before_process_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        log_context_clear()
        request_id = message.options.get(self.OPTION)
        if isinstance(request_id, str) and request_id:
            current_request_id.set(request_id)

    def after_process_message(self, broker: dramatiq.Broker, message: MessageProxy,
                              *, result: object = None,
                              exception: BaseException | None = None) -> None:
        log_context_clear()

    def after_skip_message(self, broker: dramatiq.Broker, message: MessageProxy) -> None:
        log_context_clear()


def broker_setup() -> dramatiq.Broker:
    broker = DoorbellRedisBroker(url=settings.REDIS_URL, namespace=NAMESPACE)
    broker.add_middleware(DbConnectionsMiddleware())
    broker.add_middleware(RequestIdMiddleware())
    dramatiq.set_broker(broker)
    return broker
