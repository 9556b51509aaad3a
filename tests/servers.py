"""Local HTTP(S) servers for tests: threaded, on a loopback address, recording what they
got, with routes per path (shared by the fetcher's, the ingest's and the webhooks' tests)."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass
from email.message import Message
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import trustme


@dataclass
class Seen:
    method: str
    path: str
    headers: Message
    body: bytes


Route = Callable[["_Handler"], None]


class LocalServer:
    """A threaded HTTP (or HTTPS) server on a loopback address that records what it got."""

    def __init__(self, host: str, tls: ssl.SSLContext | None) -> None:
        self.tls = tls
        self.routes: dict[str, Route] = {}
        self.requests: list[Seen] = []
        self.accepted = 0
        self.sni: list[str | None] = []
        self.release = threading.Event()  # stalled handlers wait on this
        if tls is not None:
            tls.sni_callback = self._record_sni
        server_class = _HTTPServer6 if ":" in host else _HTTPServer
        self.httpd = server_class((host, 0), _Handler)
        self.httpd.owner = self
        self.host = host
        self.port: int = self.httpd.server_address[1]
        # stop() (shutdown) waits for serve_forever to see it between two polls: at 0.05 s
        # that was about 50 ms of every test taking a server, a tenth of test_net's time.
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True
        )

    def _record_sni(self, sslobj: Any, name: str | None, context: ssl.SSLContext) -> None:
        self.sni.append(name)

    def url(self, path: str = "/", *, host: str | None = None) -> str:
        scheme = "https" if self.tls else "http"
        host = host or (f"[{self.host}]" if ":" in self.host else self.host)
        return f"{scheme}://{host}:{self.port}{path}"

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    owner: LocalServer

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        self.owner.accepted += 1
        if self.owner.tls is not None:
            sock = self.owner.tls.wrap_socket(sock, server_side=True)
        return sock, address


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(BaseHTTPRequestHandler):
    server: _HTTPServer

    def do_GET(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        owner = self.server.owner
        owner.requests.append(Seen(self.command, self.path, self.headers, body))
        owner.routes.get(self.path.split("?")[0], _ok)(self)

    do_HEAD = do_GET
    do_POST = do_GET

    def log_message(self, format: str, *args: Any) -> None:
        pass


def reply(
    handler: _Handler,
    status: int = 200,
    body: bytes = b"ok",
    headers: dict[str, str] | None = None,
    *,
    advertise: bool = True,
) -> None:
    handler.send_response(status)
    for name, value in (headers or {}).items():
        handler.send_header(name, value)
    if advertise:
        handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    if handler.command != "HEAD":
        handler.wfile.write(body)


def _ok(handler: _Handler) -> None:
    reply(handler)


def redirect(location: str, status: int = 302) -> Route:
    return lambda handler: reply(handler, status, b"", {"Location": location})


def tls_context(ca: trustme.CA, *names: str) -> ssl.SSLContext:
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert(*names).configure_cert(context)
    return context


def free_port() -> int:
    """A loopback port nothing listens on right now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def trickle(first: bytes, *, every: float) -> Route:
    """A tarpit: send ``first`` raw (a status line, some headers, the start of a body), then
    one byte every ``every`` seconds until the client hangs up or the server stops."""

    def route(handler: _Handler) -> None:
        handler.close_connection = True
        try:
            handler.wfile.write(first)
            while not handler.server.owner.release.wait(every):
                handler.wfile.write(b"a")
        except OSError:
            pass  # the client cut the connection: what the tests want

    return route


def launcher_interrupt(launcher: subprocess.Popen[bytes], timeout: float = 60) -> bool:
    """Ctrl-C for a launcher started in its own session, as a person would press it; True
    when it stopped in time, else its whole process group is killed and False."""
    launcher.send_signal(signal.SIGINT)
    try:
        launcher.wait(timeout=timeout)
        return True
    except subprocess.TimeoutExpired:
        os.killpg(launcher.pid, signal.SIGKILL)
        launcher.wait()
        return False
