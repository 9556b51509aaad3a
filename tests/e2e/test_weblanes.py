"""The web role's lanes (anex/weblanes.py) as gunicorn runs them: the role's own command
with two workers, one serving /realtime/ and one the rest, against this test run's
PostgreSQL and Redis and a stub engine. Which process served what is read from the system
(/proc: who holds which socket), not from the server's word."""

from __future__ import annotations

import http.client
import json
import os
import re
import select
import signal
import socket
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.factories import api_key_make, organization_make
from tests.roles import role_running, until_alive
from tests.servers import LocalServer, free_port, reply

pytestmark = pytest.mark.django_db(transaction=True)
MINILM = "all-minilm-l6-v2"
EMBEDDING = json.dumps({"model": MINILM, "input": "hello"})


@dataclass
class Web:
    port: int
    lanes: dict[str, int]  # lane -> the pid of its worker
    headers: dict[str, str]

    def connect(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)

    def ask(self, connection: http.client.HTTPConnection, method: str, path: str,
            body: str | None = None) -> http.client.HTTPResponse:
        connection.request(method, path, body=body, headers=self.headers)
        response = connection.getresponse()
        response.read()
        return response


def vector_answer(handler: Any) -> None:
    sent = json.loads(handler.server.owner.requests[-1].body)
    reply(handler, body=json.dumps({"data": [
        {"embedding": [1.0] + [0.0] * 383, "prompt_tokens": 5} for _ in sent["input"]]}
    ).encode())


@contextmanager
def web_with_lanes(tmp_path: Path, engine: LocalServer) -> Iterator[Web]:
    """The web role with two workers (a realtime and a control one) and four threads each,
    MiniLM's realtime engine at `engine`, and a key of an organization with credits."""
    from billing.services import credits_grant
    from tests.factories import SYSTEM

    organization = organization_make()
    credits_grant(organization=organization, cents=100_000, reason="test", actor=SYSTEM)
    _key, plaintext = api_key_make(organization)
    port = free_port()
    log = tmp_path / "web.log"
    with role_running("web", log=log, ANEX_WEB_BIND=f"127.0.0.1:{port}",
                      ANEX_WEB_WORKERS="2", ANEX_WEB_THREADS="4",
                      ANEX_REALTIME_ENGINES=f"{MINILM}={engine.url('')}",
                      ANEX_REALTIME_ENGINE_SECRET="lanes-test-secret") as process:
        until_alive(lambda: len(re.findall(r"serves the \w+ lane", log.read_text())) == 2,
                    process, log)
        lanes = {lane: int(pid) for pid, lane in
                 re.findall(r"web worker (\d+) serves the (\w+) lane", log.read_text())}
        assert set(lanes) == {"control", "realtime"}, log.read_text()
        yield Web(port, lanes, {"Authorization": f"Bearer {plaintext}",
                                "Content-Type": "application/json"})


def holders(local_port: int) -> dict[int, set[int]]:
    """For each TCP connection on 127.0.0.1 whose local port is local_port, by its remote
    port: the processes holding its socket (none: in flight, or in a listen queue). Read
    from /proc/net/tcp and each process's descriptors."""
    by_inode: dict[str, int] = {}
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        local, remote = fields[1], fields[2]
        if int(local.rsplit(":", 1)[1], 16) == local_port:
            by_inode[f"socket:[{fields[9]}]"] = int(remote.rsplit(":", 1)[1], 16)
    found: dict[int, set[int]] = {port: set() for port in by_inode.values()}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            links = {os.readlink(fd) for fd in (proc / "fd").iterdir()}
        except OSError:
            continue
        for inode in links & by_inode.keys():
            found[by_inode[inode]].add(int(proc.name))
    return found


def until(done: Any, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not done() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert done()


def test_one_connection_is_served_by_each_lane_in_turn_and_rests_with_the_control_worker(
        tmp_path: Path, server: LocalServer) -> None:
    callers: list[int] = []

    def engine(handler: Any) -> None:  # which process called the engine
        callers.extend(holders(handler.client_address[1])[server.port])
        vector_answer(handler)

    server.routes["/v1/embeddings"] = engine
    with web_with_lanes(tmp_path, server) as web:
        connection = web.connect()
        statuses = []
        for _ in range(3):
            statuses.append(web.ask(connection, "POST", "/realtime/v1/embeddings",
                                    EMBEDDING).status)
            statuses.append(web.ask(connection, "GET", "/healthz").status)
            statuses.append(web.ask(connection, "GET", f"/batch/v1/jobs/{uuid.uuid4()}").status)
        # every request on the one connection answered, realtime and not in turn
        assert statuses == [200, 200, 404] * 3
        # the engine was called by the realtime worker only
        assert callers and set(callers) == {web.lanes["realtime"]}
        # and after a realtime answer, the idle connection is back with the control worker
        web.ask(connection, "POST", "/realtime/v1/embeddings", EMBEDDING)
        client_port = connection.sock.getsockname()[1]
        until(lambda: holders(web.port).get(client_port) == {web.lanes["control"]})
        connection.close()


def lane_queue_room() -> int:
    """How many handed connections a lane's queue holds (a Unix datagram socket pair: as
    many as the sender's buffer has room for, each carrying a descriptor)."""
    sender, receiver = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    sender.setblocking(False)
    with sender, receiver, socket.socket() as carried:
        message = json.dumps([["127.0.0.1", 65535], ["127.0.0.1", 65535]]).encode() + b"\n"
        room = 0
        try:
            while True:
                socket.send_fds(sender, [message], [carried.fileno()])
                room += 1
        except BlockingIOError:
            return room


def embedding_sent(web: Web) -> socket.socket:
    """A connection with a realtime embedding sent on it, its answer not read."""
    body = EMBEDDING.encode()
    head = "".join(f"{name}: {value}\r\n" for name, value in {
        **web.headers, "Host": "127.0.0.1", "Content-Length": str(len(body))}.items())
    sock = socket.create_connection(("127.0.0.1", web.port), timeout=60)
    sock.sendall(f"POST /realtime/v1/embeddings HTTP/1.1\r\n{head}\r\n".encode() + body)
    return sock


def status_of(sock: socket.socket) -> int:
    response = http.client.HTTPResponse(sock)
    response.begin()
    response.read()
    sock.close()
    return response.status


def test_a_stopped_realtime_lane_leaves_the_batch_api_answering_and_loses_nothing(
        tmp_path: Path, server: LocalServer) -> None:
    sent = lane_queue_room() + 8  # the last few wait in the control worker for room
    server.routes["/v1/embeddings"] = vector_answer
    with web_with_lanes(tmp_path, server) as web:
        # given the realtime worker stopped (SIGSTOP: it takes nothing from its queue)
        os.kill(web.lanes["realtime"], signal.SIGSTOP)
        try:
            # when more realtime requests arrive than its queue holds, each on its own
            # connection
            sockets = [embedding_sent(web) for _ in range(sent)]
            ports = [sock.getsockname()[1] for sock in sockets]
            control = {web.lanes["control"]}

            def waiting() -> int:
                held = holders(web.port)
                return sum(held.get(port) == control for port in ports)

            def settled() -> bool:  # some wait in the control worker, and no more move
                before = waiting()
                time.sleep(0.3)
                return before >= 1 and waiting() == before

            until(settled)
            # then the batch API and /healthz are answered meanwhile, by the control worker
            connection = web.connect()
            assert web.ask(connection, "GET", "/healthz").status == 200
            assert web.ask(connection, "GET", f"/batch/v1/jobs/{uuid.uuid4()}").status == 404
            connection.close()
            # and those past the queue's room wait in the control worker (the queued ones
            # are in flight, in no process's descriptors), none answered nor refused
            held = [holders(web.port).get(port) for port in ports]
            assert 1 <= held.count(control) <= 16
            assert held.count(set()) == sent - held.count(control)
            assert select.select(sockets, [], [], 0.5)[0] == []
        finally:
            os.kill(web.lanes["realtime"], signal.SIGCONT)
        # and once the realtime worker runs again, every one is answered by the engine
        assert [status_of(sock) for sock in sockets] == [200] * sent
        assert len(server.requests) == sent
