"""The web lanes' two decisions (anex/weblanes.py), read apart from gunicorn: which lane a
request line goes to, and which lane the master gives a new worker as gunicorn starts,
replaces and reloads them. tests/e2e/test_weblanes.py runs the lanes in gunicorn."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from anex.weblanes import CONTROL, REALTIME, Lanes, lane_assign, request_lane


@pytest.mark.parametrize("head,lane", [
    (b"POST /realtime/v1/embeddings HTTP/1.1\r\nHost: x\r\n\r\n", REALTIME),
    (b"GET /realtime/v1/models HTTP/1.1\r\n", REALTIME),
    (b"POST /realtime/v1/systemone?x=1 HTTP/1.1\n", REALTIME),
    (b"GET /batch/v1/jobs/5 HTTP/1.1\r\nX-Path: /realtime/v1/embeddings\r\n\r\n", CONTROL),
    (b"GET /healthz HTTP/1.1\r\n\r\n", CONTROL),
    (b"GET /console/realtime/ HTTP/1.1\r\n", CONTROL),
    (b"GET /realtime HTTP/1.1\r\n", CONTROL),  # not under /realtime/: the 404 is Django's
    (b"POST /openai/v1/batches HTTP/1.1\r\n", CONTROL),
    (b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", CONTROL),
    (b"POST /real", CONTROL),  # a request line cut short: served where it is
    (b"", CONTROL),
])
def test_a_request_goes_to_the_realtime_lane_only_by_its_path(head: bytes, lane: str) -> None:
    assert request_lane(head) == lane


@dataclass
class Worker:
    age: int
    lane: str | None = None
    lanes: Any = None


@dataclass
class Arbiter:
    """What lane_assign reads of gunicorn's Arbiter: its live workers, how many it keeps,
    the lanes its on_starting hook made; spawn() as Arbiter.spawn_worker calls pre_fork,
    stop() as it reaps the oldest past num_workers."""

    num_workers: int
    anex_lanes: Any
    WORKERS: dict[int, Worker] = field(default_factory=dict)
    age: int = 0

    def spawn(self) -> Worker:
        self.age += 1
        worker = Worker(self.age)
        lane_assign(self, worker)
        self.WORKERS[self.age] = worker
        return worker

    def reap_oldest(self) -> None:
        while len(self.WORKERS) > self.num_workers:
            del self.WORKERS[min(self.WORKERS)]

    def lanes(self) -> list[str | None]:
        return sorted((worker.lane for worker in self.WORKERS.values()), key=str)


@pytest.fixture
def lanes() -> Any:
    made = Lanes(2)
    yield made
    for lane in (CONTROL, REALTIME):
        made.inbox(lane).close()
        made.outbox(lane).close()


def test_the_master_keeps_its_realtime_workers_through_crashes_and_reloads(lanes: Lanes) -> None:
    # given five workers, two of them realtime
    arbiter = Arbiter(num_workers=5, anex_lanes=lanes)
    for _ in range(5):
        arbiter.spawn()
    assert arbiter.lanes() == [CONTROL] * 3 + [REALTIME] * 2
    # when a realtime worker dies, its replacement is realtime; a control one, control
    for lane in (REALTIME, CONTROL, REALTIME):
        dead = next(age for age, worker in arbiter.WORKERS.items() if worker.lane == lane)
        del arbiter.WORKERS[dead]
        assert arbiter.spawn().lane == lane
        assert arbiter.lanes() == [CONTROL] * 3 + [REALTIME] * 2
    # when it reloads (HUP: five new workers first, then the oldest stopped)
    for _ in range(5):
        arbiter.spawn()
    arbiter.reap_oldest()
    # then the new five are split as the old were
    assert arbiter.lanes() == [CONTROL] * 3 + [REALTIME] * 2
    assert min(arbiter.WORKERS) > 8


def test_without_lanes_every_worker_serves_everything() -> None:
    arbiter = Arbiter(num_workers=2, anex_lanes=None)
    assert [arbiter.spawn().lane, arbiter.spawn().lane] == [None, None]


def test_a_lanes_queue_carries_a_connection_to_another_process(lanes: Lanes) -> None:
    # A datagram with a descriptor goes in at the outbox and comes out at the inbox.
    import socket

    left, right = socket.socketpair()
    with left, right:
        socket.send_fds(lanes.outbox(REALTIME), [b"[1, 2]\n"], [left.fileno()])
        message, fds, _flags, _address = socket.recv_fds(lanes.inbox(REALTIME), 1024, 1)
        assert message == b"[1, 2]\n" and len(fds) == 1
        with socket.socket(fileno=fds[0]) as handed:
            handed.sendall(b"ping")
            assert right.recv(4) == b"ping"
