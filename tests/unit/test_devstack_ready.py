"""`make run` says "anex is up" only once its processes are ready: the launcher's wait
(anex.devstack.wait_healthy, on /readyz) goes on through 503s and takes only a 200."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from anex.devstack import Stopper, wait_healthy

# The launcher asks every half a second; the probe here answers at once.
ASK_EVERY = 0.05


class Probe(ThreadingHTTPServer):
    """A /readyz that answers 503 (an engine loading) until `ready` is set."""

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.ready = threading.Event()
        self.asked = 0


class _Handler(BaseHTTPRequestHandler):
    server: Probe

    def do_GET(self) -> None:
        self.server.asked += 1
        if self.server.asked >= 3:
            self.server.ready.set()
        self.send_response(200 if self.server.ready.is_set() else 503)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


@pytest.fixture
def probe() -> Iterator[Probe]:
    server = Probe()
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.01},
                     daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def test_the_launcher_waits_through_503_for_ready(probe: Probe) -> None:
    url = f"http://127.0.0.1:{probe.server_address[1]}/readyz"
    assert wait_healthy(url, Stopper(), timeout=60, every=ASK_EVERY)
    # it asked until the probe said ready, not at the first answer
    assert probe.asked == 3


def test_never_ready_is_never_up(probe: Probe) -> None:
    probe.asked = -10**9  # stays 503
    url = f"http://127.0.0.1:{probe.server_address[1]}/readyz"
    assert not wait_healthy(url, Stopper(), timeout=0.5, every=ASK_EVERY)
    assert probe.asked > -10**9
