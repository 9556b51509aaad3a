"""The SSRF-safe fetcher: what it refuses, that it refuses before connecting, and that what
it allows (streaming, caps, timeouts, redirects, TLS) works against local servers.

Two guards wrap every test here so nothing can leave this machine even if `anex.net` were
broken: every socket connect is recorded and any to a non-loopback address fails, and name
lookups never reach a resolver (names come from a table; anything else must be numeric).
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import trustme
from django.conf import settings as django_settings

from anex import net
from anex.net import (
    DeadlineExceeded,
    FetchConnectionError,
    FetchError,
    FetchResponse,
    FetchTimeout,
    TooLarge,
    TooManyRedirects,
    UnsafeURL,
    no_reply,
)
from tests.servers import LocalServer, _Handler, redirect, reply, tls_context, trickle

TENANT = "organization-a"


def fetch(*args: Any, **kwargs: Any) -> FetchResponse:
    """anex.net.fetch for one organization (TENANT, unless a test names another)."""
    return net.fetch(*args, **{"tenant": TENANT, **kwargs})

# --- guards -------------------------------------------------------------------------------

AddrInfo = tuple[Any, Any, int, str, tuple[Any, ...]]


class FakeDNS:
    """getaddrinfo with a table of names; each name's answers can change from call to call."""

    def __init__(self, real: Callable[..., list[AddrInfo]]) -> None:
        self.real = real
        self.answers: dict[str, list[list[str]]] = {}
        self.lookups: list[str] = []

    def add(self, name: str, *answers: list[str]) -> None:
        """Answer the n-th lookup of ``name`` with ``answers[n]`` (the last one repeats)."""
        self.answers[name] = list(answers)

    def count(self, name: str) -> int:
        return self.lookups.count(name)

    def __call__(
        self, host: str, port: int, family: int = 0, type: int = 0, proto: int = 0, flags: int = 0
    ) -> list[AddrInfo]:
        self.lookups.append(host)
        if host in self.answers:
            answers = self.answers[host]
            addresses = answers[min(self.count(host) - 1, len(answers) - 1)]
            return [_addrinfo(address, port) for address in addresses]
        if host == "localhost":  # /etc/hosts, no resolver
            return self.real(host, port, family, type, proto, flags)
        # Numeric spellings only (127.1, 0x7f.1, 2130706433, ::1): never a DNS query.
        return self.real(host, port, family, type, proto, flags | socket.AI_NUMERICHOST)


def _addrinfo(address: str, port: int) -> AddrInfo:
    if ":" in address:
        return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (address, port))


@pytest.fixture(autouse=True)
def dns(monkeypatch: pytest.MonkeyPatch) -> FakeDNS:
    fake = FakeDNS(socket.getaddrinfo)
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture(autouse=True)
def connects(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every outgoing connect as (address, port); a non-loopback one fails instead."""
    attempts: list[tuple[str, int]] = []
    real_connect = socket.socket.connect

    def guarded(sock: socket.socket, address: Any) -> None:
        attempts.append((address[0], address[1]))
        if not ipaddress.ip_address(address[0]).is_loopback:
            raise OSError("test guard: connect to a non-loopback address")
        real_connect(sock, address)

    def refuse(sock: socket.socket, address: Any) -> int:
        raise AssertionError("connect_ex is not expected")

    monkeypatch.setattr(socket.socket, "connect", guarded)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    return attempts


def to_url_host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


# --- refused before any connection --------------------------------------------------------

REFUSED = [
    "127.0.0.1",
    "127.8.9.10",
    "::1",
    "10.0.0.1",
    "172.16.0.1",
    "172.31.255.254",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "100.127.255.254",
    "0.0.0.0",  # noqa: S104 (an address to refuse, not one to bind)
    "240.0.0.1",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "192.0.2.1",
    "198.18.0.1",
    "::",
    "fe80::1",
    "fc00::1",
    "fd12:3456::1",
    "ff02::1",
    "2001:db8::1",
    "2001::1",  # Teredo
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "::ffff:169.254.169.254",
    "::7f00:1",  # IPv4-compatible 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254
    "64:ff9b:1::a9fe:a9fe",  # local-use NAT64
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    # Python 3.11 calls these global (issue 11):
    "192.0.0.8",  # IPv4 dummy address, in IETF protocol assignments
    "192.0.0.9",
    "192.0.0.255",
    "fec0::1",  # deprecated site-local
    "feff:ffff::1",
    "3fff::1",  # documentation (RFC 9637)
    "3fff:fff:ffff::1",
    "::ffff:192.0.0.8",
]
# Everything but 127/8 and ::1 themselves: wrapped loopback stays refused with the setting on.
NOT_LOOPBACK = [a for a in REFUSED if not ipaddress.ip_address(a).is_loopback]


@pytest.mark.parametrize("address", REFUSED)
def test_literal_addresses_are_refused_without_connecting(
    address: str, connects: list[tuple[str, int]]
) -> None:
    with pytest.raises(UnsafeURL, match="not a public internet address"):
        fetch("GET", f"https://{to_url_host(address)}/latest/meta-data/")
    assert connects == []


@pytest.mark.parametrize("address", REFUSED)
def test_names_resolving_to_refused_addresses_are_refused_without_connecting(
    address: str, dns: FakeDNS, connects: list[tuple[str, int]]
) -> None:
    dns.add("victim.test", [address])

    with pytest.raises(UnsafeURL) as refused:
        fetch("GET", "https://victim.test/")

    assert connects == []
    assert address not in str(refused.value)  # internal DNS is not echoed to the customer


@pytest.mark.parametrize("address", NOT_LOOPBACK)
def test_allowing_loopback_still_refuses_everything_else(
    address: str, dns: FakeDNS, connects: list[tuple[str, int]], loopback: None
) -> None:
    dns.add("victim.test", [address])

    with pytest.raises(UnsafeURL):
        fetch("GET", "https://victim.test/")
    with pytest.raises(UnsafeURL):
        fetch("GET", f"http://{to_url_host(address)}/")

    assert connects == []


@pytest.mark.parametrize(
    "spelling", ["2130706433", "0x7f.1", "017700000001", "127.1", "0x7f000001"]
)
def test_numeric_spellings_of_loopback_never_reach_a_listener(
    spelling: str, server: LocalServer, connects: list[tuple[str, int]]
) -> None:
    with pytest.raises(UnsafeURL):
        fetch("GET", f"https://{spelling}:{server.port}/")

    assert connects == []
    assert server.accepted == 0


@pytest.mark.parametrize("host", ["127.0.0.1", "::1"])
def test_a_real_loopback_listener_accepts_nothing(
    host: str, make_server: Callable[..., LocalServer], connects: list[tuple[str, int]]
) -> None:
    listener = make_server(host)
    with pytest.raises(UnsafeURL):
        fetch("GET", f"https://{to_url_host(host)}:{listener.port}/")

    assert connects == []
    assert listener.accepted == 0


def test_a_name_resolving_to_loopback_is_refused(
    server: LocalServer, connects: list[tuple[str, int]]
) -> None:
    with pytest.raises(UnsafeURL, match="localhost is not a public internet address"):
        fetch("GET", f"https://localhost:{server.port}/")

    assert connects == []
    assert server.accepted == 0


def test_one_private_answer_refuses_the_whole_host(
    dns: FakeDNS, connects: list[tuple[str, int]]
) -> None:
    dns.add("mixed.test", ["2606:4700:4700::1111", "93.184.215.14", "10.0.0.1"])

    with pytest.raises(UnsafeURL):
        fetch("GET", "https://mixed.test/")

    assert connects == []


@pytest.mark.parametrize(
    "address",
    ["8.8.8.8", "1.1.1.1", "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:808:808::1"],
)
def test_public_addresses_pass_the_check(address: str) -> None:
    # Judged without connecting: nothing in this module may leave loopback.
    assert net._address_allowed(ipaddress.ip_address(address), allow_loopback=False)


def test_loopback_is_allowed_only_through_the_setting_which_defaults_off() -> None:
    assert getattr(django_settings, "ANEX_FETCH_ALLOW_LOOPBACK", False) is False
    for address in ("127.0.0.1", "127.255.0.1", "::1"):
        ip = ipaddress.ip_address(address)
        assert not net._address_allowed(ip, allow_loopback=False)
        assert net._address_allowed(ip, allow_loopback=True)
    # Wrapped forms of loopback are not loopback to the kernel: a 6to4 address is routed
    # to a relay, so the setting never opens them.
    for address in ("::ffff:127.0.0.1", "::7f00:1", "2002:7f00:1::", "64:ff9b::7f00:1"):
        assert not net._address_allowed(ipaddress.ip_address(address), allow_loopback=True)


@pytest.mark.parametrize(
    "url",
    [
        "http://example.com/",
        "ftp://example.com/file",
        "file:///etc/passwd",
        "gopher://example.com/",
        "dict://example.com:11211/",
        "https://user:pass@example.com/",
        "https://user@example.com/",
        "https://@example.com/",
        "https:///path",
        "https://",
        "https://:443/",
        "example.com/path",
        "//example.com/",
        "https://exa mple.com/",
        "https://example.com/a\r\nX-Injected: 1",
        "https://example.com\\@10.0.0.1/",
        "https://example.com:99999/",
        "https://example.com:0/",
        "https://example.com:port/",
        "https://[fe80::1%25eth0]/",
        "https://%31%32%37.0.0.1/",
    ],
)
def test_non_https_and_malformed_urls_are_refused_before_resolving(
    url: str, dns: FakeDNS, connects: list[tuple[str, int]]
) -> None:
    with pytest.raises(UnsafeURL):
        fetch("GET", url)

    assert dns.lookups == []
    assert connects == []


# --- plain http: loopback only, and only when tests allow it ------------------------------


def test_http_is_refused_when_loopback_is_not_allowed(
    server: LocalServer, connects: list[tuple[str, int]]
) -> None:
    with pytest.raises(UnsafeURL, match="only https"):
        fetch("GET", server.url())

    assert connects == []
    assert server.accepted == 0


def test_http_to_loopback_works_when_allowed(server: LocalServer, loopback: None) -> None:
    with fetch("GET", server.url("/hello")) as response:
        assert response.status == 200
        assert response.read() == b"ok"

    assert [(seen.method, seen.path) for seen in server.requests] == [("GET", "/hello")]


def test_http_to_a_public_host_is_refused_even_when_loopback_is_allowed(
    dns: FakeDNS, connects: list[tuple[str, int]], loopback: None
) -> None:
    dns.add("public.test", ["2606:4700:4700::1111"])

    with pytest.raises(UnsafeURL, match="only https"):
        fetch("GET", "http://public.test/")

    assert connects == []


# --- DNS rebinding ------------------------------------------------------------------------


def test_the_name_is_resolved_once_and_the_checked_address_is_used(
    server: LocalServer, dns: FakeDNS, connects: list[tuple[str, int]], loopback: None
) -> None:
    # given a name whose second answer would point into the private network
    dns.add("rebind.test", ["127.0.0.1"], ["10.0.0.1"])

    # when
    with fetch("GET", server.url("/", host="rebind.test")) as response:
        status = response.status

    # then
    assert status == 200
    assert dns.count("rebind.test") == 1
    assert connects == [("127.0.0.1", server.port)]
    assert server.requests[0].headers["Host"] == f"rebind.test:{server.port}"


def test_each_redirect_hop_resolves_once(
    server: LocalServer, dns: FakeDNS, connects: list[tuple[str, int]], loopback: None
) -> None:
    dns.add("first.test", ["127.0.0.1"], ["10.0.0.1"])
    dns.add("second.test", ["127.0.0.1"], ["10.0.0.1"])
    server.routes["/start"] = redirect(server.url("/end", host="second.test"))

    with fetch("GET", server.url("/start", host="first.test"), max_redirects=2) as response:
        assert response.status == 200
        assert response.url == server.url("/end", host="second.test")

    assert dns.count("first.test") == 1
    assert dns.count("second.test") == 1
    assert connects == [("127.0.0.1", server.port)] * 2
    assert [seen.headers["Host"] for seen in server.requests] == [
        f"first.test:{server.port}",
        f"second.test:{server.port}",
    ]


def test_the_next_checked_address_is_tried_when_one_does_not_answer(
    server: LocalServer, dns: FakeDNS, connects: list[tuple[str, int]], loopback: None
) -> None:
    dns.add("dual.test", ["127.0.0.2", "127.0.0.1"])  # nothing listens on 127.0.0.2

    with fetch("GET", server.url("/", host="dual.test")) as response:
        assert response.status == 200

    assert connects == [("127.0.0.2", server.port), ("127.0.0.1", server.port)]
    assert dns.count("dual.test") == 1


# --- redirects ----------------------------------------------------------------------------

METADATA_REDIRECTS = [
    "http://169.254.169.254/latest/meta-data/",
    "https://169.254.169.254/latest/meta-data/",
    "https://[::ffff:169.254.169.254]/",
    "http://2852039166/",
    "https://metadata.test/",
    "https://10.0.0.1:6379/",
]


@pytest.mark.parametrize("location", METADATA_REDIRECTS)
def test_a_redirect_is_returned_not_followed_by_default(
    location: str,
    server: LocalServer,
    dns: FakeDNS,
    connects: list[tuple[str, int]],
    loopback: None,
) -> None:
    dns.add("metadata.test", ["169.254.169.254"])
    server.routes["/go"] = redirect(location)

    with fetch("GET", server.url("/go")) as response:
        assert response.status == 302
        assert response.headers["location"] == location

    assert connects == [("127.0.0.1", server.port)]
    assert dns.count("metadata.test") == 0


@pytest.mark.parametrize("location", METADATA_REDIRECTS)
def test_a_followed_redirect_to_a_private_address_is_refused_without_connecting(
    location: str,
    server: LocalServer,
    dns: FakeDNS,
    connects: list[tuple[str, int]],
    loopback: None,
) -> None:
    dns.add("metadata.test", ["169.254.169.254"])
    server.routes["/go"] = redirect(location)

    with pytest.raises(UnsafeURL):
        fetch("GET", server.url("/go"), max_redirects=5)

    assert connects == [("127.0.0.1", server.port)]


def test_a_relative_redirect_is_followed_within_the_limit(
    server: LocalServer, loopback: None
) -> None:
    server.routes["/old"] = redirect("/new?x=1", status=301)

    with fetch("GET", server.url("/old"), max_redirects=1) as response:
        assert response.status == 200
        assert response.url == server.url("/new?x=1")

    assert [seen.path for seen in server.requests] == ["/old", "/new?x=1"]


def test_too_many_redirects(server: LocalServer, loopback: None) -> None:
    server.routes["/loop"] = redirect("/loop")

    with pytest.raises(TooManyRedirects):
        fetch("GET", server.url("/loop"), max_redirects=3)

    assert len(server.requests) == 4


def test_303_after_a_post_becomes_a_get_without_the_body(
    server: LocalServer, loopback: None
) -> None:
    server.routes["/hook"] = redirect("/thanks", status=303)
    headers = {"Content-Type": "application/json", "webhook-id": "msg_1"}

    with fetch("POST", server.url("/hook"), headers=headers, body=b"{}", max_redirects=1):
        pass

    second = server.requests[1]
    assert (second.method, second.body) == ("GET", b"")
    assert second.headers["Content-Type"] is None
    assert second.headers["webhook-id"] == "msg_1"


def test_307_keeps_the_method_and_body(server: LocalServer, loopback: None) -> None:
    server.routes["/hook"] = redirect("/moved", status=307)

    with fetch("POST", server.url("/hook"), body=b'{"a":1}', max_redirects=1):
        pass

    assert [(s.method, s.path, s.body) for s in server.requests] == [
        ("POST", "/hook", b'{"a":1}'),
        ("POST", "/moved", b'{"a":1}'),
    ]


def test_credentials_are_not_carried_to_another_origin(
    server: LocalServer, dns: FakeDNS, loopback: None
) -> None:
    dns.add("other.test", ["127.0.0.1"])
    server.routes["/start"] = redirect(server.url("/end", host="other.test"))
    headers = {"Authorization": "Bearer secret", "Cookie": "s=1", "X-Trace": "t"}

    with fetch("GET", server.url("/start"), headers=headers, max_redirects=1):
        pass

    first, second = server.requests
    assert first.headers["Authorization"] == "Bearer secret"
    assert second.headers["Authorization"] is None
    assert second.headers["Cookie"] is None
    assert second.headers["X-Trace"] == "t"


# --- bodies, caps, methods ----------------------------------------------------------------


def test_the_byte_cap_stops_a_body_of_unknown_length(server: LocalServer, loopback: None) -> None:
    server.routes["/big"] = lambda h: reply(h, body=b"x" * 10_000, advertise=False)
    received: list[bytes] = []

    with fetch("GET", server.url("/big"), max_bytes=4096) as response:
        assert response.content_length is None
        with pytest.raises(TooLarge):
            for chunk in response.iter_chunks(chunk_size=1000):
                received.append(chunk)

    assert sum(len(chunk) for chunk in received) <= 4096
    assert all(len(chunk) <= 1000 for chunk in received)


def test_a_body_exactly_at_the_cap_is_read(server: LocalServer, loopback: None) -> None:
    server.routes["/exact"] = lambda h: reply(h, body=b"y" * 4096, advertise=False)

    with fetch("GET", server.url("/exact"), max_bytes=4096) as response:
        assert response.read() == b"y" * 4096


def test_an_advertised_size_over_the_cap_is_refused_before_reading(
    server: LocalServer, loopback: None
) -> None:
    def headers_then_stall(handler: _Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "10000")
        handler.end_headers()
        handler.wfile.flush()
        handler.server.owner.release.wait(10)

    server.routes["/big"] = headers_then_stall

    # A read would stall for read_timeout and raise FetchTimeout; TooLarge proves none was made.
    with fetch("GET", server.url("/big"), max_bytes=4096, read_timeout=5) as response:
        assert response.content_length == 10_000
        started = time.monotonic()
        with pytest.raises(TooLarge):
            next(response.iter_chunks())
        assert time.monotonic() - started < 1


def test_head_reports_the_advertised_length(server: LocalServer, loopback: None) -> None:
    server.routes["/clip.mp4"] = lambda h: reply(
        h, body=b"z" * 12_345, headers={"Content-Type": "video/mp4"}
    )

    with fetch("HEAD", server.url("/clip.mp4")) as response:
        assert response.status == 200
        assert response.content_length == 12_345
        assert response.headers["content-type"] == "video/mp4"
        assert response.read() == b""

    assert server.requests[0].method == "HEAD"


def test_post_sends_the_body_and_headers_and_cannot_override_host(
    server: LocalServer, loopback: None
) -> None:
    body = b'{"type":"job.completed"}'
    headers = {"Content-Type": "application/json", "webhook-id": "msg_1", "Host": "evil.test"}

    with fetch("POST", server.url("/hook"), headers=headers, body=body) as response:
        assert response.status == 200

    seen = server.requests[0]
    assert (seen.method, seen.body) == ("POST", body)
    assert seen.headers["Content-Type"] == "application/json"
    assert seen.headers["webhook-id"] == "msg_1"
    assert seen.headers.get_all("Host") == [f"127.0.0.1:{server.port}"]


def test_unsupported_methods_are_a_programming_error() -> None:
    with pytest.raises(ValueError, match="unsupported method"):
        fetch("DELETE", "https://example.com/")  # type: ignore[arg-type]


# --- timeouts and connection failures -----------------------------------------------------


def test_a_server_that_never_answers_times_out(server: LocalServer, loopback: None) -> None:
    def stall(handler: _Handler) -> None:
        handler.server.owner.release.wait(10)

    server.routes["/stall"] = stall

    started = time.monotonic()
    with pytest.raises(FetchTimeout):
        fetch("GET", server.url("/stall"), read_timeout=0.3)
    assert time.monotonic() - started < 3


def test_a_body_that_stalls_times_out_while_streaming(server: LocalServer, loopback: None) -> None:
    def some_then_stall(handler: _Handler) -> None:
        handler.send_response(200)
        handler.send_header("Content-Length", "100")
        handler.end_headers()
        handler.wfile.write(b"a" * 10)
        handler.wfile.flush()
        handler.server.owner.release.wait(10)

    server.routes["/slow"] = some_then_stall

    with fetch("GET", server.url("/slow"), read_timeout=0.3) as response:
        started = time.monotonic()
        with pytest.raises(FetchTimeout):
            response.read()
        assert time.monotonic() - started < 3


# --- one deadline for the whole fetch -----------------------------------------------------
# Each byte below arrives well within the read timeout, so only the deadline can end them.


def test_headers_trickled_one_byte_a_second_are_cut_at_the_deadline(
    server: LocalServer, loopback: None
) -> None:
    server.routes["/tarpit"] = trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=1.0)

    started = time.monotonic()
    # (before a reply began: said as any unreachable host is, issue 22 L9)
    with pytest.raises(DeadlineExceeded, match=re.escape(no_reply("127.0.0.1"))):
        fetch("GET", server.url("/tarpit"), read_timeout=5, deadline=1)
    assert 0.9 < time.monotonic() - started < 3


@pytest.mark.parametrize("length", [b"Content-Length: 100000\r\n", b""])
def test_a_trickled_body_is_cut_at_the_deadline_never_taken_as_complete(
    length: bytes, server: LocalServer, loopback: None
) -> None:
    # Without a Content-Length the cut connection looks like the body's end: the deadline
    # must still be an error, or a truncated file would be stored as the customer's.
    server.routes["/tarpit"] = trickle(b"HTTP/1.1 200 OK\r\n" + length + b"\r\n{", every=0.1)

    started = time.monotonic()
    with fetch("GET", server.url("/tarpit"), read_timeout=5, deadline=0.6) as response:
        assert response.status == 200
        with pytest.raises(DeadlineExceeded):
            for _chunk in response.iter_chunks():
                pass
    assert time.monotonic() - started < 3


def test_a_stalled_tls_handshake_is_cut_at_the_deadline(
    dns: FakeDNS, loopback: None, trust_ca: None
) -> None:
    # given a listener that completes TCP (the kernel's backlog) but never speaks TLS
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        dns.add("files.customer.test", ["127.0.0.1"])
        url = f"https://files.customer.test:{listener.getsockname()[1]}/"

        started = time.monotonic()
        with pytest.raises(DeadlineExceeded):
            fetch("GET", url, connect_timeout=10, read_timeout=10, deadline=0.5)
        assert time.monotonic() - started < 3


def test_the_deadline_spans_every_redirect_hop(server: LocalServer, loopback: None) -> None:
    server.routes["/start"] = redirect("/tarpit")
    server.routes["/tarpit"] = trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=0.1)

    started = time.monotonic()
    with pytest.raises(DeadlineExceeded):
        fetch("GET", server.url("/start"), max_redirects=1, read_timeout=5, deadline=0.6)
    assert time.monotonic() - started < 3


def test_the_default_deadline_is_one_connect_and_one_read(
    server: LocalServer, loopback: None
) -> None:
    server.routes["/tarpit"] = trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=0.1)

    started = time.monotonic()
    # Cut before its headers ended, it reads as any host that did not reply (issue 22 L9),
    # so the 1 s shows in the time taken, not the message.
    with pytest.raises(DeadlineExceeded, match=re.escape(no_reply("127.0.0.1"))):
        fetch("GET", server.url("/tarpit"), connect_timeout=0.3, read_timeout=0.7)
    assert 1.0 <= time.monotonic() - started < 2.5


def test_other_fetches_are_answered_while_one_is_tarpitted(
    server: LocalServer, loopback: None
) -> None:
    tarpit = trickle(b"HTTP/1.1 200 OK\r\nX-Slow: ", every=0.2)
    tarpitted = threading.Event()

    def route(handler: _Handler) -> None:
        tarpitted.set()
        tarpit(handler)

    server.routes["/tarpit"] = route
    outcome: list[BaseException] = []

    def attacked() -> None:
        try:
            fetch("GET", server.url("/tarpit"), read_timeout=5, deadline=1.5)
        except FetchError as exc:
            outcome.append(exc)

    attack = threading.Thread(target=attacked)
    attack.start()
    tarpitted.wait(5)  # the other fetch goes while the attack is being trickled
    started = time.monotonic()
    with fetch("GET", server.url("/hello")) as response:
        assert response.read() == b"ok"
    assert time.monotonic() - started < 1
    assert attack.is_alive()  # the answer came while the attack ran
    attack.join(5)
    assert [type(exc) for exc in outcome] == [DeadlineExceeded]


def test_a_finished_fetch_stops_its_deadline_timer(server: LocalServer, loopback: None) -> None:
    before = threading.active_count()
    for _ in range(5):
        with fetch("GET", server.url("/hello"), deadline=60) as response:
            assert response.read() == b"ok"
    time.sleep(0.2)
    # No timer is left waiting out its 60 seconds (the server's own threads have ended).
    assert threading.active_count() <= before


def test_a_closed_port_is_a_connection_error(loopback: None) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]

    with pytest.raises(FetchConnectionError, match=re.escape(no_reply("127.0.0.1"))):
        fetch("GET", f"http://127.0.0.1:{port}/")


@pytest.mark.parametrize("internal", [["10.1.2.3"], ["192.0.0.8"], ["fec0::5"], []])
def test_an_unknown_name_and_an_internal_one_get_the_same_refusal(
    internal: list[str], dns: FakeDNS, connects: list[tuple[str, int]]
) -> None:
    # given a name our resolver knows (internal) and one it does not: an attacker probing
    # our internal DNS through source_url must not learn which is which
    dns.add("internal.test", internal)

    # when
    with pytest.raises(UnsafeURL) as unknown:
        fetch("GET", "https://nowhere.test/")
    with pytest.raises(UnsafeURL) as known:
        fetch("GET", "https://internal.test/")

    # then the answers differ only in the name the caller gave
    assert str(unknown.value) == "nowhere.test is not a public internet address"
    assert str(known.value) == str(unknown.value).replace("nowhere.test", "internal.test")
    assert connects == []


def test_every_failure_is_a_fetch_error() -> None:
    for error in (UnsafeURL, FetchTimeout, DeadlineExceeded, FetchConnectionError, TooLarge,
                  TooManyRedirects):
        assert issubclass(error, FetchError)


# --- TLS ----------------------------------------------------------------------------------


@pytest.mark.parametrize("address", ["127.0.0.1", "::1"])
def test_https_pins_the_address_but_verifies_the_name(
    address: str,
    ca: trustme.CA,
    make_server: Callable[..., LocalServer],
    dns: FakeDNS,
    connects: list[tuple[str, int]],
    loopback: None,
    trust_ca: None,
) -> None:
    tls_server = make_server(address, tls_context(ca, "files.customer.test"))
    dns.add("files.customer.test", [address])

    with fetch("GET", tls_server.url("/in.jsonl", host="files.customer.test")) as response:
        assert response.status == 200
        assert response.read() == b"ok"

    assert tls_server.sni == ["files.customer.test"]
    assert tls_server.requests[0].headers["Host"] == f"files.customer.test:{tls_server.port}"
    assert connects == [(address, tls_server.port)]


def test_https_refuses_a_certificate_for_another_name(
    ca: trustme.CA,
    make_server: Callable[..., LocalServer],
    dns: FakeDNS,
    loopback: None,
    trust_ca: None,
) -> None:
    tls_server = make_server(tls=tls_context(ca, "someone-else.test"))
    dns.add("files.customer.test", ["127.0.0.1"])

    with pytest.raises(FetchConnectionError, match="its TLS certificate did not verify"):
        fetch("GET", tls_server.url("/", host="files.customer.test"))

    assert tls_server.requests == []


def test_https_refuses_a_certificate_from_an_untrusted_ca(
    ca: trustme.CA, make_server: Callable[..., LocalServer], dns: FakeDNS, loopback: None
) -> None:
    # No ANEX_FETCH_CA_BUNDLE: only the system CAs are trusted.
    tls_server = make_server(tls=tls_context(ca, "files.customer.test"))
    dns.add("files.customer.test", ["127.0.0.1"])

    with pytest.raises(FetchConnectionError, match="its TLS certificate did not verify"):
        fetch("GET", tls_server.url("/", host="files.customer.test"))

    assert tls_server.requests == []


# --- issue 22, L9: no port-scan oracle, the name lookup inside the deadline ---------------


def test_a_closed_port_a_silent_one_and_a_failed_handshake_read_the_same(
    server: LocalServer, loopback: None, ca: trustme.CA, dns: FakeDNS, trust_ca: None
) -> None:
    # given a closed port, an open one that never answers, and one that does not speak TLS
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed = probe.getsockname()[1]
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(1)
    dns.add("files.customer.test", ["127.0.0.1"])
    messages = []
    cases: list[tuple[str, dict[str, Any]]] = [
        (f"http://127.0.0.1:{closed}/", {}),
        (f"http://127.0.0.1:{silent.getsockname()[1]}/", {"read_timeout": 0.3}),
        (server.url("/", host="files.customer.test").replace("http:", "https:"), {})]
    for url, options in cases:
        with pytest.raises(FetchError) as failed:
            fetch("GET", url, **options)
        messages.append(str(failed.value))
    silent.close()
    # then a customer who names them learns nothing about which is which
    assert messages == [no_reply("127.0.0.1"), no_reply("127.0.0.1"),
                        no_reply("files.customer.test")]


def test_a_name_lookup_that_hangs_ends_at_the_deadline(
    monkeypatch: pytest.MonkeyPatch, connects: list[tuple[str, int]]
) -> None:
    released = threading.Event()

    def hanging(*args: Any, **kwargs: Any) -> list[AddrInfo]:
        released.wait(10)  # a resolver that never answers
        return []

    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    started = time.process_time(), time.monotonic()
    try:
        with pytest.raises(DeadlineExceeded, match=re.escape(no_reply("slow-dns.test"))):
            fetch("GET", "https://slow-dns.test/", deadline=0.5)
        # the fetch returned well before the lookup would have (10 s)
        assert time.monotonic() - started[1] < 5
    finally:
        released.set()
    assert connects == []


def test_one_organizations_hanging_lookups_leave_the_others_theirs(
    monkeypatch: pytest.MonkeyPatch, dns: FakeDNS, server: LocalServer, loopback: None
) -> None:
    """Issue 40 L5: organization A's zone never answers; A fetches from it more often than
    there are resolver threads, and organization B's fetch is still looked up and served."""
    released = threading.Event()

    def resolver(host: str, *args: Any, **kwargs: Any) -> list[AddrInfo]:
        if host.endswith(".slow-zone.test"):
            released.wait(30)  # A's name servers drop every query
            return []
        return dns(host, *args, **kwargs)

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    dns.add("files.b.test", ["127.0.0.1"])
    server.routes["/b"] = lambda h: reply(h, body=b"B's file")
    stuck: list[BaseException] = []

    def a_fetch(n: int) -> None:
        try:
            fetch("GET", f"https://{n}.slow-zone.test/", tenant="organization-a", deadline=2)
        except FetchError as exc:
            stuck.append(exc)

    threads = [threading.Thread(target=a_fetch, args=(n,), daemon=True)
               for n in range(2 * net.RESOLVER_THREADS)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(0.2)  # A's lookups are on the resolver threads, hanging
        # when organization B fetches meanwhile, then its lookup is answered and its file read
        started = time.monotonic()
        with fetch("GET", server.url("/b", host="files.b.test"), tenant="organization-b",
                   deadline=10) as response:
            assert response.read() == b"B's file"
        assert time.monotonic() - started < 5
    finally:
        released.set()
        for thread in threads:
            thread.join(30)
    # and each of A's fetches failed alone (at its deadline, or once released on a name
    # that resolved to nothing)
    assert len(stuck) == len(threads)


def test_a_tenants_lookups_past_its_share_wait_for_its_own(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    """Never more than TENANT_LOOKUPS of one tenant on the resolver threads, abandoned ones
    included; each given back when its lookup ends."""
    running: list[str] = []
    most = [0]
    lock = threading.Lock()
    released = threading.Event()

    def resolver(host: str, port: int, *args: Any, **kwargs: Any) -> list[AddrInfo]:
        with lock:
            running.append(host)
            most[0] = max(most[0], len(running))
        released.wait(30)
        with lock:
            running.remove(host)
        return [_addrinfo("93.184.215.14", port)]

    monkeypatch.setattr(socket, "getaddrinfo", resolver)
    ended: list[type[BaseException]] = []

    def a_fetch(n: int) -> None:
        try:
            fetch("GET", f"https://{n}.slow-zone.test/", deadline=0.5)
        except FetchError as exc:
            ended.append(type(exc))

    threads = [threading.Thread(target=a_fetch, args=(n,), daemon=True)
               for n in range(3 * net.TENANT_LOOKUPS)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    finally:
        released.set()
    assert most[0] == net.TENANT_LOOKUPS  # the rest gave up waiting for A's own share
    assert ended == [DeadlineExceeded] * len(threads)
    deadline = time.monotonic() + 10
    while net._LOOKUPS._held and time.monotonic() < deadline:
        time.sleep(0.01)
    assert net._LOOKUPS._held == {}  # every share given back once its lookup ended
