"""Every message jobs.dispatch sends names an actor the worker declares, on the queue
dispatch names for it; a GPU worker takes no more of its queue than it can start."""

from __future__ import annotations

import threading
import time

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.worker import _WorkerMiddleware

import jobs.tasks  # noqa: F401 - declares the actors
from jobs import dispatch
from tests.dispatched import Sent, dispatch_catch


@pytest.mark.parametrize("name,queue", sorted(dispatch.ACTOR_QUEUES.items()))
def test_every_name_dispatch_sends_is_a_declared_actor(name: str, queue: str) -> None:
    actor = dramatiq.get_broker().get_actor(name)
    assert actor.queue_name == queue


def test_a_message_goes_to_its_actors_queue_or_the_one_given(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Sent] = []
    dispatch_catch(monkeypatch, sent.append, "job_start_task", "chunk_run_task")
    dispatch.send("job_start_task", "j1")
    dispatch.chunk_send(chunk_id="c1", region="eu", model="laya", delay_ms=5)  # type: ignore[arg-type]
    assert sent == [Sent("job_start_task", ("j1",), "jobs", None),
                    Sent("chunk_run_task", ("c1",), "run.eu.laya", 5)]


def test_the_broker_receives_the_message_by_name() -> None:
    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    broker.flush("jobs")
    dispatch.send("job_start_task", "7b0e4a1c-0000-4000-8000-000000000000")
    # A Redis broker keeps the message's id on the queue and its body in the hash.
    [message] = [dramatiq.Message.decode(body) for body in broker.client.hvals(
        f"{broker.namespace}:jobs.msgs")]
    assert (message.actor_name, list(message.args)) == (
        "job_start_task", ["7b0e4a1c-0000-4000-8000-000000000000"])
    broker.flush("jobs")


@pytest.mark.django_db
def test_a_gpu_worker_holds_one_chunk_more_than_its_threads() -> None:
    """Under the model's in-flight cap a worker that hoards what it cannot start leaves
    another's engine empty: a GPU worker takes its threads' messages and one spare, the rest
    stay on the queue for whichever worker frees first."""
    broker = dramatiq.get_broker()
    assert isinstance(broker, RedisBroker)
    queue = dispatch.run_queue("world", "prefetch-probe")
    broker.flush(queue)
    started = threading.Semaphore(0)
    release = threading.Event()

    def hold(number: int) -> None:
        started.release()
        release.wait(20)

    actor = dramatiq.actor(actor_name="prefetch_probe", queue_name=queue, broker=broker)(hold)
    dispatch.gpu_prefetch_install()
    worker = dramatiq.Worker(broker, queues={queue}, worker_threads=2, worker_timeout=20)
    try:
        for number in range(10):
            actor.send(number)
        worker.start()
        assert started.acquire(timeout=10) and started.acquire(timeout=10)
        # the consumer's polls meanwhile (twenty, one every 20 ms) take what its prefetch allows
        time.sleep(0.4)
        # Two running, one spare taken; seven left for the fleet's other workers.
        assert broker.client.llen(f"{broker.namespace}:{queue}") == 7
        assert worker.queue_prefetch == dispatch.gpu_prefetch(2) == 3
    finally:
        release.set()
        worker.stop()
        broker.middleware[:] = [m for m in broker.middleware
                                if not isinstance(m, dispatch.GpuPrefetch)
                                and not (isinstance(m, _WorkerMiddleware) and m.worker is worker)]
        broker.flush(queue)
        broker.actors.pop("prefetch_probe", None)


def test_a_cpu_worker_keeps_dramatiqs_prefetch() -> None:
    worker = dramatiq.Worker(dramatiq.get_broker(), queues={"ingest", "estimate"},
                             worker_threads=2)
    dispatch.GpuPrefetch().before_worker_boot(dramatiq.get_broker(), worker)
    assert worker.queue_prefetch == 4
    gpu = dramatiq.Worker(dramatiq.get_broker(), queues={"run.eu.laya", "sample.eu.laya"},
                          worker_threads=2)
    dispatch.GpuPrefetch().before_worker_boot(dramatiq.get_broker(), gpu)
    assert gpu.queue_prefetch == 3
