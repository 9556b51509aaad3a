"""Messages a test catches instead of sending (jobs/dispatch.py sends every one): nothing
consumes them here; the test runs the work itself or asserts what was sent."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pytest


@dataclass(frozen=True)
class Sent:
    actor: str
    args: tuple[str, ...]
    queue: str  # the queue it would have gone to
    delay_ms: int | None

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
                 delay_ms: int | None = None) -> None:
        if actor not in actors:
            send(actor, *args, queue=queue, delay_ms=delay_ms)
            return
        record(Sent(actor, args, queue or dispatch.ACTOR_QUEUES[actor], delay_ms))

    monkeypatch.setattr(dispatch, "send", catching)
