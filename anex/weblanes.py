"""The web role's gunicorn worker: realtime served by web workers of its own (issue 23).

A realtime request mostly waits on its engine, and a saturated realtime API fills the web
tier with them. In one process a job read then waited twice: for a free thread, behind the
realtime requests queued before it in gunicorn's thread pool, and once taken, for the
interpreter lock at each of its database round trips, among the realtime threads. With
ANEX_WEB_REALTIME_WORKERS (half the web workers; none when there is one) the web role's
workers are in two lanes:

- A **control** worker accepts every connection and holds every idle one. When one becomes
  readable it looks at the request line without taking it (MSG_PEEK): a request under
  /realtime/ has its connection handed to the realtime workers, and anything else (the
  batch API, the console, /healthz) is served in the control worker's own threads.
- A **realtime** worker serves the request it was handed and, where the connection stays
  open, hands it straight back to the control workers from the thread that answered, so a
  client's next request is read by a control worker whatever it is.

A connection is handed with its descriptor (SCM_RIGHTS) over a Unix datagram socket pair
per lane, made by gunicorn's master before it forks (`lanes_prepare`, the `on_starting`
hook), so a worker that replaces one holds them too; the master keeps them open, so a
connection handed while a lane's worker restarts waits for the next one. The master says
each new worker's lane (`lane_assign`, the `pre_fork` hook) from the workers that will
survive it, so a reload (HUP) or a crash keeps the split.

A realtime request waits in the control worker, holding no thread, while the realtime
lane's queue is full (its workers take from it as fast as their event loops run, so a full
queue is a realtime lane that is stopped or restarting), and is handed once there is room:
a control worker never answers for the realtime lane, whose own cap refuses past
saturation (503 with Retry-After, realtime.services.realtime_place_take), at that lane's
cost. What cannot be handed is served where it is, as before: a connection whose
read-ahead is too large to carry, a request line the peek cannot read whole (an answer is
never wrong, only less isolated), a request for the batch API that a realtime worker
could not hand back. Lanes need gunicorn's plain HTTP/1.1 (no TLS, no PROXY protocol:
both are read once per connection); with either, every worker serves everything.
"""

from __future__ import annotations

import json
import logging
import os
import selectors
import socket
import time
from collections import deque
from functools import partial
from typing import Any

from gunicorn.workers.gthread import DEFAULT_WORKER_DATA_TIMEOUT, TConn, ThreadWorker

logger = logging.getLogger(__name__)

CONTROL = "control"
REALTIME = "realtime"
REALTIME_PATH = b"/realtime/"
PEEK_BYTES = 512  # enough for any request line routed by its path
CARRY_MAX = 16 * 1024  # the most read-ahead a handed connection carries with it
DATAGRAM_MAX = CARRY_MAX + 1024
RECEIVE_BATCH = 64  # connections taken from a lane's queue per wake of the event loop
_HANDED = object()  # handle()'s answer for a connection handed to the other lane


class Lanes:
    """The two lanes' queues of handed connections: what is sent on a lane's `outbox` is
    received on its `inbox`, by one of that lane's workers."""

    def __init__(self, realtime_workers: int) -> None:
        self.realtime_workers = realtime_workers
        self._ends = {lane: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
                      for lane in (CONTROL, REALTIME)}
        for pair in self._ends.values():
            for end in pair:
                end.setblocking(False)

    def inbox(self, lane: str) -> socket.socket:
        return self._ends[lane][0]

    def outbox(self, lane: str) -> socket.socket:
        return self._ends[lane][1]


def lanes_prepare(server: Any) -> None:
    """gunicorn's on_starting hook: the lanes' queues, in the master, before any fork."""
    from django.conf import settings

    server.anex_lanes = None
    count = settings.ANEX_WEB_REALTIME_WORKERS
    if not count:
        return
    if server.cfg.is_ssl or server.cfg.proxy_protocol != "off":
        server.log.warning("ANEX_WEB_REALTIME_WORKERS=%d is ignored: gunicorn serves TLS or "
                           "the PROXY protocol itself; every worker serves every path", count)
        return
    server.anex_lanes = Lanes(count)
    server.log.info("web lanes: %d realtime worker(s), %d control worker(s)", count,
                    server.num_workers - count)


def lane_assign(server: Any, worker: Any) -> None:
    """gunicorn's pre_fork hook: the new worker's lane. gunicorn keeps its newest workers
    (a reload starts the new ones first, then stops the oldest), so the lane is the one
    that the newest of the others leave short."""
    lanes = worker.lanes = getattr(server, "anex_lanes", None)
    if lanes is None:
        worker.lane = None
        return
    others = sorted(server.WORKERS.values(), key=lambda other: other.age, reverse=True)
    kept = others[:max(server.num_workers - 1, 0)]
    realtime = sum(1 for other in kept if getattr(other, "lane", None) == REALTIME)
    worker.lane = REALTIME if realtime < lanes.realtime_workers else CONTROL


def request_lane(head: bytes) -> str:
    """The lane of the request that starts with head (bytes as they came): realtime for a
    request line whose path is under /realtime/."""
    line = head.split(b"\n", 1)[0]
    parts = line.split(b" ", 2)
    if len(parts) >= 2 and parts[1].startswith(REALTIME_PATH):
        return REALTIME
    return CONTROL


def _address(value: Any) -> Any:
    return tuple(value) if isinstance(value, list) else value


def _carried(conn: TConn) -> bytes:
    """What conn's parser has read past the last request: the start of its next one."""
    return conn.parser.unreader.buf.getvalue() if conn.parser is not None else b""


class LaneWorker(ThreadWorker):
    """gunicorn's threaded worker, in the lane its master gave it (see the module's text);
    with no lanes, gunicorn's gthread worker unchanged."""

    lane: str | None = None
    lanes: Lanes | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._accepting: bool = False
        self._for_realtime: deque[TConn] = deque()  # waiting for room in its lane's queue

    def set_accept_enabled(self, enabled: bool) -> None:
        """A control worker accepts connections and takes the ones handed back; a realtime
        worker takes only what it is handed."""
        if self.lanes is None or self.lane is None:
            super().set_accept_enabled(enabled)
            return
        if enabled == self._accepting:
            return
        inbox = self.lanes.inbox(self.lane)
        if enabled:
            self.poller.register(inbox, selectors.EVENT_READ, self._receive)
        else:
            self.poller.unregister(inbox)
        if self.lane == CONTROL:
            super().set_accept_enabled(enabled)
        else:
            self._accepting = enabled

    def enqueue_req(self, conn: TConn) -> None:
        if self.lanes is not None and self.lane is not None and not conn.is_http2:
            lane = self._lane_of(conn)
            if lane is None:
                self._await_request(conn)
                return
            if lane != self.lane and len(_carried(conn)) <= CARRY_MAX:
                if lane == REALTIME and self._for_realtime:  # in turn, behind those waiting
                    self._wait_for_realtime(conn)
                    return
                if self._hand(conn, lane):
                    self.nr_conns -= 1
                    return
                if lane == REALTIME:
                    self._wait_for_realtime(conn)
                    return
        super().enqueue_req(conn)

    def handle(self, conn: TConn) -> Any:
        """Serve conn's request; a realtime worker then hands a connection that stays open
        back to the control workers from this thread (its event loop may be slow to)."""
        result = super().handle(conn)
        if (result is True and self.lane == REALTIME and self.alive
                and len(_carried(conn)) <= CARRY_MAX and self._hand(conn, CONTROL)):
            return _HANDED
        return result

    def finish_request(self, conn: TConn, fs: Any) -> None:
        if not fs.cancelled() and fs.exception() is None and fs.result() is _HANDED:
            self.nr_conns -= 1
            return
        super().finish_request(conn, fs)

    # -- routing ------------------------------------------------------------------------

    def _lane_of(self, conn: TConn) -> str | None:
        """The lane of the request waiting on conn, from its read-ahead and what the socket
        holds (peeked, not taken); None when nothing has arrived yet."""
        carried = _carried(conn)
        try:
            head = carried + conn.sock.recv(PEEK_BYTES, socket.MSG_PEEK | socket.MSG_DONTWAIT)
        except BlockingIOError:
            if not carried:
                return None
            head = carried
        except OSError:  # reset: the thread that serves it meets the error and closes it
            return self.lane
        if not head:  # closed by the client: likewise
            return self.lane
        return request_lane(head)

    def _await_request(self, conn: TConn) -> None:
        """A connection accepted before its request arrived waits on the poller, holding no
        thread, for as long as gunicorn would have waited (a thread's wait, then idle)."""
        conn.timeout = time.monotonic() + DEFAULT_WORKER_DATA_TIMEOUT + self.cfg.keepalive
        self.pending_conns.append(conn)
        self.poller.register(conn.sock, selectors.EVENT_READ,
                             partial(self.on_pending_socket_readable, conn))

    def _hand(self, conn: TConn, lane: str) -> bool:
        """Send conn to lane's workers, with its read-ahead (at most CARRY_MAX); False
        (conn still this worker's) when the lane's queue is full."""
        assert self.lanes is not None
        header = json.dumps([conn.client, conn.server], default=str).encode()
        try:
            socket.send_fds(self.lanes.outbox(lane), [header + b"\n" + _carried(conn)],
                            [conn.sock.fileno()])
        except OSError:  # full: no worker of the lane has taken from it lately
            return False
        conn.sock.close()  # this process's descriptor only: the connection goes on there
        return True

    def _wait_for_realtime(self, conn: TConn) -> None:
        """Keep conn, holding no thread, until the realtime lane's queue has room (the
        poller says when its outbox can be written to)."""
        assert self.lanes is not None
        self._for_realtime.append(conn)
        if len(self._for_realtime) == 1:
            self.poller.register(self.lanes.outbox(REALTIME), selectors.EVENT_WRITE,
                                 self._hand_waiting)

    def _hand_waiting(self, outbox: socket.socket) -> None:
        while self._for_realtime:
            if not self._hand(self._for_realtime[0], REALTIME):
                return
            self._for_realtime.popleft()
            self.nr_conns -= 1
        self.poller.unregister(outbox)

    def _receive(self, inbox: socket.socket) -> None:
        """Take the connections handed to this worker's lane: a realtime worker serves
        each; a control worker keeps each as an idle connection until its next request."""
        for _ in range(RECEIVE_BATCH):
            try:
                message, fds, _flags, _ = socket.recv_fds(inbox, DATAGRAM_MAX, 1)
            except (BlockingIOError, InterruptedError):
                return
            conn = self._conn_of(message, fds)
            if conn is None:
                continue
            self.nr_conns += 1
            if self.lane == REALTIME:
                conn.data_ready = True
                super().enqueue_req(conn)
            elif conn.parser is not None:  # it carries the start of its next request
                self.enqueue_req(conn)
            else:
                conn.set_timeout()
                self.keepalived_conns.append(conn)
                self.poller.register(conn.sock, selectors.EVENT_READ,
                                     partial(self.on_client_socket_readable, conn))

    def _conn_of(self, message: bytes, fds: list[int]) -> TConn | None:
        for extra in fds[1:]:
            os.close(extra)
        if not fds:
            return None
        sock = socket.socket(fileno=fds[0])
        header, _, carried = message.partition(b"\n")
        try:
            client, server = json.loads(header)
        except ValueError:
            logger.error("a handed connection came without its addresses; closed")
            sock.close()
            return None
        conn = TConn(self.cfg, sock, _address(client), _address(server))
        if carried:
            conn.init()
            conn.parser.unreader.unread(carried)
            conn.sock.setblocking(False)
        return conn
