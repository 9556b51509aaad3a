"""The broker's doorbell (docs/dev/decisions/2026-12-02-the-brokers-doorbell.md): Dramatiq's
Redis broker and consumer with a bell rung on send (anex/internals: the consumer subclasses
Dramatiq's private _RedisConsumer through the broker's consumer_class hook)."""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import dramatiq
import redis
from dramatiq.broker import Consumer, MessageProxy

# _RedisConsumer: what RedisBroker.consumer_class names, subclassed through that hook.
from dramatiq.brokers.redis import RedisBroker, _RedisConsumer
from redis.backoff import NoBackoff
from redis.retry import Retry

logger = logging.getLogger(__name__)

# How long an idle consumer's own poll waits between two doorbell waits (Dramatiq's backoff,
# capped here): the fetch after a bell, not a wait of its own.
_FETCH_PAUSE_MS = 5


class Doorbell:
    """A sent message rings its queue's bell; an idle consumer of that queue in any worker
    process wakes on it instead of at the end of its poll
    (docs/dev/decisions/2026-12-02-the-brokers-doorbell.md). Dramatiq's Redis broker has no blocking
    fetch: an idle consumer backs off to the worker's timeout (a second by default) between fetches,
    so each hop of a job (approve -> start -> chunks -> finalize) waited up to a second for its
    worker to look.

    The bell is a Redis publish of the queue's name on the broker's channel (one per Redis
    database: the channels of a server are shared by its databases). A worker process
    listens on one thread and sets the bell of each of its queues named. A bell is a hint:
    a lost one (the listener reconnecting, Redis restarting) costs at most the poll it
    replaced, and a spurious one one fetch."""

    def __init__(self, client: redis.Redis, namespace: str) -> None:
        self.client = client
        database = client.connection_pool.connection_kwargs.get("db", 0)
        self.channel = f"{namespace}:doorbell:{database}"
        self._bells: dict[str, threading.Event] = {}
        self._lock = threading.Lock()
        self._listener: threading.Thread | None = None
        self.pubsub: redis.client.PubSub | None = None  # the listener's, while it listens
        # How its connection is named in Redis's CLIENT LIST.
        self.client_name = f"{namespace}-doorbell-{os.getpid()}"

    def ring(self, queue: str) -> None:
        try:
            self.client.publish(self.channel, queue)
        except redis.RedisError:
            # The message is on its queue; its consumer finds it at its next poll.
            logger.debug("doorbell of %s not rung", queue, exc_info=True)

    def bell(self, queue: str) -> threading.Event:
        """The event set when `queue` is rung, listening from the first one asked for."""
        with self._lock:
            event = self._bells.setdefault(queue, threading.Event())
            if self._listener is None:
                self._listener = threading.Thread(target=self._listen, name="anex-doorbell",
                                                  daemon=True)
                self._listener.start()
        return event

    def _listen(self) -> None:
        while True:
            subscriber = pubsub = None
            try:
                subscriber = self._subscriber()
                pubsub = subscriber.pubsub(ignore_subscribe_messages=True)
                pubsub.subscribe(self.channel)
                pubsub.ping()  # answered once the subscription is in place
                # Whatever was sent while no one listened is fetched now.
                for bell in list(self._bells.values()):
                    bell.set()
                self.pubsub = pubsub
                for item in pubsub.listen():
                    if item["type"] == "message":
                        event = self._bells.get(item["data"].decode())
                        if event is not None:
                            event.set()
            except (redis.RedisError, OSError):
                # Meanwhile every consumer polls as it would without a bell.
                logger.debug("doorbell listener reconnecting", exc_info=True)
            except Exception:
                # Never the end of the listener: its consumers would poll for good.
                logger.exception("doorbell listener failed; listening again")
            finally:
                self.pubsub = None
                if pubsub is not None:
                    pubsub.close()
                if subscriber is not None:
                    subscriber.close()
            time.sleep(1)

    def _subscriber(self) -> redis.Redis:
        """A client of its own for the listener, whose connection redis-py never retries or
        reconnects by itself: a lost connection ends listen(), and the loop subscribes
        again from scratch (redis-py's own reconnection of a subscribed connection could
        leave it subscribed and deaf)."""
        pool = self.client.connection_pool
        return redis.Redis(connection_pool=redis.ConnectionPool(
            connection_class=pool.connection_class,
            **{**pool.connection_kwargs, "retry": Retry(NoBackoff(), 0),
               "client_name": self.client_name}))


class DoorbellRedisBroker(RedisBroker):
    """Dramatiq's Redis broker with a doorbell (Doorbell above): a message sent for now
    rings its queue's bell; a consumer that finds its queue empty waits for the bell, or
    for the worker's timeout as before, then fetches. A delayed message rings when it comes
    due (the worker moves it to its queue through enqueue)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.doorbell = Doorbell(self.client, self.namespace)

    def enqueue(self, message: dramatiq.Message[Any], *,
                delay: int | None = None) -> dramatiq.Message[Any]:
        sent = super().enqueue(message, delay=delay)
        if delay is None:
            self.doorbell.ring(sent.queue_name)
        return sent

    @property
    def consumer_class(self) -> type[Consumer]:
        # Dramatiq's hook for the consumer a broker hands its worker.
        return DoorbellConsumer


class DoorbellConsumer(_RedisConsumer):  # type: ignore[misc]
    """Dramatiq's Redis consumer, whose idle wait is its queue's bell: its own backoff is
    capped at a few milliseconds, and the worker's timeout becomes the longest wait for the
    bell, so an idle queue is still fetched from at least that often."""

    def __init__(self, broker: DoorbellRedisBroker, queue_name: str, prefetch: int,
                 timeout: int) -> None:
        super().__init__(broker, queue_name, prefetch, min(timeout, _FETCH_PAUSE_MS))
        self.idle_s = timeout / 1000
        self.bell = broker.doorbell.bell(queue_name)

    def __next__(self) -> MessageProxy | None:
        # Cleared before the fetch: a bell rung after it is kept for the wait.
        self.bell.clear()
        message = super().__next__()
        if message is None:
            self.bell.wait(self.idle_s)
        return message
