"""Every message jobs.dispatch sends names an actor the worker declares, on the queue
dispatch names for it."""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker

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
