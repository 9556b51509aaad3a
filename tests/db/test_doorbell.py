"""The broker's doorbell (anex.internals.doorbell.Doorbell): an idle consumer waits for its
queue's bell up to the worker's timeout, and a message sent for now wakes it; a bell that
never comes costs the poll it replaced, no more."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

from anex.internals.doorbell import DoorbellConsumer, DoorbellRedisBroker

# The worker timeout of these consumers: far longer than any wait the tests allow, so a
# consumer that answers sooner was woken by its bell.
IDLE_MS = 60_000


@pytest.fixture
def broker() -> DoorbellRedisBroker:
    broker = dramatiq.get_broker()
    assert isinstance(broker, DoorbellRedisBroker)
    return broker


@pytest.fixture
def queue(broker: DoorbellRedisBroker) -> Any:
    name = f"doorbell-{uuid.uuid4().hex[:8]}"
    broker.declare_queue(name)
    yield name
    broker.flush(name)


def message_for(queue: str) -> dramatiq.Message[Any]:
    return dramatiq.Message(queue_name=queue, actor_name="doorbell_probe", args=(),
                            kwargs={}, options={})


class Fetching(threading.Thread):
    """One next() of a consumer, timed, on its own thread; what it fetched is kept (a
    thread slow to start fetches after the message is sent, and takes it)."""

    def __init__(self, consumer: DoorbellConsumer) -> None:
        super().__init__(daemon=True)
        self.consumer = consumer
        self.returned = threading.Event()
        self.seconds = 0.0
        self.message: Any = None
        self.start()

    def run(self) -> None:
        started = time.monotonic()
        self.message = next(self.consumer)
        self.seconds = time.monotonic() - started
        self.returned.set()


def listener_id(broker: DoorbellRedisBroker) -> str:
    """Redis's id of this process's listener connection, once it is subscribed."""
    deadline = time.monotonic() + 10
    while True:
        pubsub = broker.doorbell.pubsub
        ids = [client["id"] for client in broker.client.client_list()
               if client.get("name") == broker.doorbell.client_name
               and int(client.get("sub", 0)) >= 1]
        if pubsub is not None and len(ids) == 1:
            return str(ids[0])
        assert time.monotonic() < deadline, "the doorbell's listener is not subscribed"
        time.sleep(0.05)


def consumer_of(broker: DoorbellRedisBroker, queue: str, timeout: int) -> DoorbellConsumer:
    """A consumer of `queue`, once its process's listener is subscribed (which rings every
    bell once, for what was sent before it listened)."""
    consumer = broker.consume(queue, prefetch=1, timeout=timeout)
    assert isinstance(consumer, DoorbellConsumer)
    listener_id(broker)
    return consumer


def next_message(consumer: DoorbellConsumer, fetching: Fetching | None = None) -> Any:
    """The consumer's next message: the one `fetching` took, if it took it, else fetched
    here, for up to 10 s (before, a message taken by `fetching` left this loop waiting
    for the test's 300 s timeout: about one fast-tier run in ten on two busy cores)."""
    if fetching is not None and fetching.message is not None:
        return fetching.message
    deadline = time.monotonic() + 10
    while (message := next(consumer)) is None:
        assert time.monotonic() < deadline, "the consumer did not fetch the message"
    return message


def test_the_consumer_a_worker_gets_waits_for_its_bell(broker: DoorbellRedisBroker,
                                                       queue: str) -> None:
    consumer = consumer_of(broker, queue, IDLE_MS)
    fetching = Fetching(consumer)
    # Nothing on the queue: the consumer waits (Dramatiq's own would have fetched again
    # within milliseconds, and kept polling).
    assert not fetching.returned.wait(0.5)
    sent = broker.enqueue(message_for(queue))
    # The bell, not the minute-long timeout, ends the wait, and the next fetch has it.
    assert fetching.returned.wait(10)
    assert fetching.seconds < 10
    assert next_message(consumer, fetching).message_id == sent.message_id
    consumer.close()


def test_a_bell_rung_for_another_queue_wakes_no_one(broker: DoorbellRedisBroker,
                                                    queue: str) -> None:
    other = f"{queue}-other"
    broker.declare_queue(other)
    consumer = consumer_of(broker, queue, IDLE_MS)
    fetching = Fetching(consumer)
    assert not fetching.returned.wait(0.3)
    broker.enqueue(message_for(other))
    assert not fetching.returned.wait(0.7)
    broker.enqueue(message_for(queue))
    assert fetching.returned.wait(10)
    consumer.close()
    broker.flush(other)


def test_a_delayed_message_rings_when_it_comes_due(broker: DoorbellRedisBroker,
                                                   queue: str) -> None:
    """Sent with a delay, a message waits on the delay queue and rings nothing; when it
    comes due the worker moves it to its queue through enqueue, which rings."""
    consumer = consumer_of(broker, queue, IDLE_MS)
    fetching = Fetching(consumer)
    assert not fetching.returned.wait(0.3)
    delayed = broker.enqueue(message_for(queue), delay=50)
    assert delayed.queue_name.endswith(".DQ")
    assert not fetching.returned.wait(0.7)
    broker.enqueue(delayed.copy(queue_name=queue))  # what the worker does when it is due
    assert fetching.returned.wait(10)
    consumer.close()


def test_a_message_sent_without_a_bell_is_found_at_the_next_poll(
        broker: DoorbellRedisBroker, queue: str) -> None:
    """A bell lost (a sender with Dramatiq's plain broker, the listener reconnecting) costs
    the consumer's poll: the worker's timeout, here 300 ms."""
    consumer = consumer_of(broker, queue, 300)
    fetching = Fetching(consumer)
    plain = RedisBroker(client=broker.client, namespace=broker.namespace)
    plain.declare_queue(queue)
    sent = plain.enqueue(message_for(queue))
    assert fetching.returned.wait(10)
    assert next_message(consumer, fetching).message_id == sent.message_id
    consumer.close()


def test_a_bell_that_cannot_be_rung_leaves_the_message_sent(
        broker: DoorbellRedisBroker, queue: str, monkeypatch: pytest.MonkeyPatch) -> None:
    import redis

    def down(*args: Any) -> None:
        raise redis.ConnectionError("publish refused")

    monkeypatch.setattr(broker.doorbell.client, "publish", down)
    sent = broker.enqueue(message_for(queue))
    monkeypatch.undo()
    consumer = consumer_of(broker, queue, 300)
    assert next_message(consumer).message_id == sent.message_id
    consumer.close()


def test_the_channel_is_the_brokers_redis_database(broker: DoorbellRedisBroker) -> None:
    """Redis shares its channels across its databases; the test workers each have one."""
    database = broker.client.connection_pool.connection_kwargs.get("db", 0)
    assert broker.doorbell.channel == f"anex:doorbell:{database}"


def test_the_listener_comes_back_after_its_connection_is_killed(
        broker: DoorbellRedisBroker, queue: str) -> None:
    """A Redis restart or a killed connection: the listener subscribes again (after a
    second), and bells wake consumers again. Only this process's listener is killed."""
    consumer = consumer_of(broker, queue, IDLE_MS)
    before = listener_id(broker)
    assert broker.client.client_kill_filter(_id=before)
    deadline = time.monotonic() + 10
    while listener_id(broker) == before:
        assert time.monotonic() < deadline, "the listener did not subscribe again"
        time.sleep(0.05)
    fetching = Fetching(consumer)
    assert not fetching.returned.wait(0.3)
    broker.enqueue(message_for(queue))
    assert fetching.returned.wait(10)
    consumer.close()
