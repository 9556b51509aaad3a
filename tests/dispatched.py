"""Messages a test catches instead of sending (jobs/dispatch.py sends every one): nothing
consumes them here; the test runs the work itself or asserts what was sent."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Sent:
    actor: str
    args: tuple[str, ...]
    queue: str  # the queue it would have gone to
    delay_ms: int | None
    time_limit_ms: int | None = None  # its own, in place of its actor's

    @property
    def id(self) -> str:
        return self.args[0]


def dispatch_catch(monkeypatch: pytest.MonkeyPatch, record: Callable[[Sent], object],
                   *actors: str) -> None:
    """Hand every message to these actors to `record` instead of the broker; messages to
    other actors are sent as usual."""
    from jobs import dispatch

    send = dispatch.send

    def catching(actor: str, *args: str, queue: str | None = None,
                 delay_ms: int | None = None, time_limit_ms: int | None = None) -> None:
        if actor not in actors:
            send(actor, *args, queue=queue, delay_ms=delay_ms, time_limit_ms=time_limit_ms)
            return
        record(Sent(actor, args, queue or dispatch.ACTOR_QUEUES[actor], delay_ms,
                    time_limit_ms))

    monkeypatch.setattr(dispatch, "send", catching)


@contextmanager
def committed(monkeypatch: pytest.MonkeyPatch, *actors: str) -> Iterator[list[Sent]]:
    """The messages to these actors sent inside the block, caught into the list yielded:
    those sent on commit (jobs.dispatch.send_on_commit) too, which a test's own transaction
    (django_db without transaction=True) never commits: they are sent as the block ends, as
    its commit would send them. (Every on-commit step of the block runs then.)"""
    from django.test import TestCase

    caught: list[Sent] = []
    dispatch_catch(monkeypatch, caught.append, *actors)
    with TestCase.captureOnCommitCallbacks(execute=True):
        yield caught


def sent_run(messages: list[Sent]) -> None:
    """Each message taken, in order, as a worker takes it: its actor (jobs.tasks) run here."""
    import dramatiq

    import jobs.tasks  # noqa: F401 - declares the actors

    broker = dramatiq.get_broker()
    for message in messages:
        broker.get_actor(message.actor)(*message.args)


@contextmanager
def finalizes_run(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Sent]]:
    """The finalizes sent inside the block (jobs.dispatch.finalize_send: by the chunk that
    settles last, an empty start, a cancel, the recovery pass), run as the block ends, as a
    CPU worker runs them: jobs.tasks.job_finalize_task. Yields the messages."""
    with committed(monkeypatch, "job_finalize_task") as caught:
        yield caught
    sent_run(caught)
