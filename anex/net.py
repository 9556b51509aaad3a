"""The one HTTP client for every URL fetched on a customer's behalf.

Input ingest from a customer URL, media HEAD probes and webhook deliveries all call
`fetch`. A customer chooses the URL, so the fetch must never reach our own network
(cloud metadata at 169.254.169.254, the database, Redis, the admin). Each hop, the first
request and every redirect a caller opts into, is checked from scratch:

1. the URL must be https (http only to loopback, and only when tests allow loopback), with
   a host and no credentials;
2. the host is resolved exactly once and EVERY address must be public; literal IPs in any
   spelling (``2130706433``, ``0x7f.1``) are caught because only resolved addresses are
   judged, never the string;
3. the socket connects to a checked address itself while the Host header, TLS SNI and the
   certificate check use the hostname, so a second DNS answer (rebinding) never has a say.

A name that does not resolve is refused with the same words as one that resolves to our own
network: telling the two apart would let a customer map our internal DNS.

Socket timeouts bound each read, so a source sending a byte every few seconds never trips
them; one absolute deadline per fetch (connect, TLS, headers and body, every hop) does.
The name lookup runs inside that deadline too, on a shared pool of resolver threads of
which one tenant (the organization the fetch is for, `tenant`) holds at most
TENANT_LOOKUPS at once, so a tenant whose names never answer (a slow zone it controls)
cannot take every thread from the others. Bodies are streamed under a byte cap.
Redirects are handed back to the caller unless ``max_redirects`` allows following them.
Every failure is a `FetchError` whose message is safe to show the customer; every failure
before a reply began (refused, timed out, TLS) reads the same (`no_reply`), so the fetcher
is no port scanner.
"""

from __future__ import annotations

import ipaddress
import re
import socket
import threading
import time
from collections.abc import Hashable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Literal, Self
from urllib.parse import urljoin, urlsplit

import urllib3
from django.conf import settings
from urllib3 import HTTPHeaderDict
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout

Method = Literal["GET", "HEAD", "POST"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0  # per socket read, not for the whole body (see `fetch`'s deadline)
MAX_BYTES = 1024 * 1024  # callers that download real files (ingest) pass their own cap
CHUNK_SIZE = 64 * 1024

_METHODS = frozenset({"GET", "HEAD", "POST"})
_REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
_DEFAULT_PORTS = {"https": 443, "http": 80}
# Headers that belong to the origin the caller addressed, not to wherever it redirects.
_ORIGIN_BOUND_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})
_BODY_HEADERS = frozenset({"content-type", "content-length", "content-encoding"})

# Whitespace, control characters and backslashes: different URL parsers disagree on them,
# so a URL carrying one is refused rather than interpreted.
_UNSAFE_URL_CHARS = re.compile(r"[\x00-\x20\x7f\\]")
# A DNS name or an IP literal (urlsplit strips an IPv6 literal's brackets). Anything else,
# such as an IPv6 zone id, is refused.
_HOST = re.compile(r"[a-z0-9._-]+|[0-9a-f:.]+")

# Ranges refused on top of what Python 3.11 calls non-global. Shared address space is
# non-global already, but it is spelled out: carrier-grade NAT is a classic way into a
# provider's internal network. Python 3.11 calls the others global: the rest of
# 192.0.0.0/24 (IETF protocol assignments, such as 192.0.0.8, the IPv4 dummy address;
# its two anycast services are no place for a customer's file), the deprecated IPv6
# site-local fec0::/10 (still routed inside some networks) and the documentation prefix
# 3fff::/20 (RFC 9637).
_NOT_PUBLIC = (
    ipaddress.IPv4Network("100.64.0.0/10"),
    ipaddress.IPv4Network("192.0.0.0/24"),
    ipaddress.IPv6Network("fec0::/10"),
    ipaddress.IPv6Network("3fff::/20"),
)
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class FetchError(Exception):
    """Base of every failure; the message is safe to show the customer."""


class UnsafeURL(FetchError):
    """Refused before any connection: bad scheme, malformed URL or a non-public address."""


class FetchTimeout(FetchError):
    """The connect or a read took longer than its timeout."""


class DeadlineExceeded(FetchTimeout):
    """The whole fetch (connect, TLS, headers and body) took longer than its deadline."""


class FetchConnectionError(FetchError):
    """The host could not be reached, TLS failed, or the reply was broken."""


class TooLarge(FetchError):
    """The body is (or says it is) larger than the caller's byte cap."""


class TooManyRedirects(FetchError):
    """A redirect chain went past ``max_redirects``."""


class _Deadline:
    """One absolute deadline for a whole fetch, every hop and the body included.

    At the deadline a timer thread shuts the fetch's sockets down, which wakes whatever
    connect, handshake or read is blocked on them; the fetch then reports DeadlineExceeded
    rather than the broken connection it sees. The timer shuts down a duplicate of each
    socket: once TLS wraps the socket urllib3 created, that object no longer holds the
    connection, and a duplicate we own cannot have been closed and its file descriptor
    handed to someone else's socket in the meantime.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.expired = False
        self._ends = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._closed = False
        self._timer = threading.Timer(seconds, self._expire)
        self._timer.daemon = True
        self._timer.start()

    def remaining(self) -> float:
        return self._ends - time.monotonic()

    def passed(self) -> bool:
        return self.expired or self.remaining() <= 0

    def error(self, host: str) -> DeadlineExceeded:
        return DeadlineExceeded(f"{host} did not send its whole reply within "
                                f"{self.seconds:g} seconds")

    def unreachable(self, host: str) -> DeadlineExceeded:
        """The deadline passed before a reply began: said as any failure to reach the host
        is (_translate), so the time it took tells nothing about the port."""
        return DeadlineExceeded(no_reply(host))

    def watch(self, sock: socket.socket) -> None:
        """Cut this connection at the deadline (now, if it has already passed)."""
        with self._lock:
            if self._closed or self.expired:
                _shut(sock)
                return
            self._sockets.append(sock.dup())

    def _expire(self) -> None:
        with self._lock:
            if self._closed:
                return
            self.expired = True
            self._release_sockets(shut=True)

    def close(self) -> None:
        """The fetch is over: stop the timer and let go of the duplicates."""
        self._timer.cancel()
        with self._lock:
            self._closed = True
            self._release_sockets(shut=False)

    def _release_sockets(self, *, shut: bool) -> None:
        for sock in self._sockets:
            if shut:
                _shut(sock)
            sock.close()
        self._sockets.clear()


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass  # already closed or never connected: nothing left to cut


class _DeadlineHTTPConnection(HTTPConnection):
    def __init__(self, *args: Any, deadline: _Deadline, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._deadline = deadline

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self._deadline.watch(sock)
        return sock


class _DeadlineHTTPSConnection(_DeadlineHTTPConnection, HTTPSConnection):
    """HTTPSConnection.connect creates its socket with _new_conn too, before the handshake;
    the MRO puts the deadline's _new_conn in front of it."""


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


@dataclass(frozen=True)
class _Target:
    scheme: str
    host: str  # ASCII hostname or IP literal without brackets
    port: int
    request_path: str  # path and query, as sent on the request line
    host_header: str


class FetchResponse:
    """A response whose body has not been read yet; close it, or use it as a context manager."""

    def __init__(
        self,
        *,
        url: str,
        host: str,
        response: urllib3.BaseHTTPResponse,
        pool: urllib3.HTTPConnectionPool,
        max_bytes: int,
        deadline: _Deadline,
    ) -> None:
        self.url = url
        self.status: int = response.status
        self.headers: Mapping[str, str] = response.headers  # case-insensitive
        self.max_bytes = max_bytes
        self._host = host
        self._response = response
        self._pool = pool
        self._deadline = deadline

    @property
    def content_length(self) -> int | None:
        """The size the server advertises, or None when it does not say (or says nonsense)."""
        value = self.headers.get("Content-Length", "").strip()
        return int(value) if value.isascii() and value.isdigit() else None

    def iter_chunks(self, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """Yield the body as sent on the wire (not decompressed), at most ``max_bytes`` in all.

        Raises TooLarge before reading anything when the advertised size is over the cap, and
        as soon as the body passes the cap otherwise; DeadlineExceeded when the fetch's
        deadline passes first. Closes the response when done.
        """
        if self.content_length is not None and self.content_length > self.max_bytes:
            self.close()
            raise TooLarge(f"the response is larger than {self.max_bytes} bytes")
        received = 0
        try:
            while True:
                # One byte past the cap is enough to know the body is too large.
                wanted = min(chunk_size, self.max_bytes - received + 1)
                chunk = self._response.read(wanted, decode_content=False)
                # The deadline ends a read with whatever had arrived, or with an empty one
                # that looks like the end of a body of unknown length: never a complete body.
                if self._deadline.expired:
                    raise self._deadline.error(self._host)
                if not chunk:
                    return
                received += len(chunk)
                if received > self.max_bytes:
                    raise TooLarge(f"the response is larger than {self.max_bytes} bytes")
                yield chunk
        except HTTPError as exc:
            raise _translate(exc, self._host, self._deadline) from exc
        finally:
            self.close()

    def read(self) -> bytes:
        """The whole body, for small replies (a webhook's answer); bounded by ``max_bytes``."""
        return b"".join(self.iter_chunks())

    def close(self) -> None:
        self._release()
        self._deadline.close()

    def _release(self) -> None:
        """Close this hop's connection; a followed redirect keeps the fetch's deadline."""
        self._response.close()
        self._pool.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()


def fetch(
    method: Method,
    url: str,
    *,
    tenant: Hashable,
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    max_bytes: int = MAX_BYTES,
    max_redirects: int = 0,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
    deadline: float | None = None,
) -> FetchResponse:
    """Send one request to a customer-supplied URL, refusing anything not on the public internet.

    A 3xx comes back as a response unless ``max_redirects`` > 0; then each hop is checked
    like the first, and a chain longer than that raises TooManyRedirects. The body is not
    read: use ``iter_chunks()``/``read()``, and ``close()`` (or ``with``) when done.

    ``deadline`` is the seconds the whole fetch may take, from this call to the body's last
    byte, however the source paces its bytes; past it the fetch raises DeadlineExceeded.
    Unset, it is one connect timeout plus one read timeout: enough for the small replies
    most callers read (a webhook's answer, a probe's headers). Callers that download real
    files pass their own.

    ``tenant`` is whose fetch it is (an organization's id): its name lookups share its
    TENANT_LOOKUPS, never another tenant's.
    """
    if method not in _METHODS:
        raise ValueError(f"unsupported method {method!r}")
    if max_redirects < 0:
        raise ValueError("max_redirects must be >= 0")
    allow_loopback: bool = getattr(settings, "ANEX_FETCH_ALLOW_LOOPBACK", False)
    ca_certs: str | None = getattr(settings, "ANEX_FETCH_CA_BUNDLE", None)
    timer = _Deadline(connect_timeout + read_timeout if deadline is None else deadline)
    try:
        return _fetch(method, url, tenant=tenant, headers=headers, body=body,
                      max_bytes=max_bytes, max_redirects=max_redirects,
                      connect_timeout=connect_timeout, read_timeout=read_timeout,
                      deadline=timer, allow_loopback=allow_loopback, ca_certs=ca_certs)
    except BaseException:
        timer.close()
        raise


def _fetch(
    method: Method,
    url: str,
    *,
    tenant: Hashable,
    headers: Mapping[str, str] | None,
    body: bytes | None,
    max_bytes: int,
    max_redirects: int,
    connect_timeout: float,
    read_timeout: float,
    deadline: _Deadline,
    allow_loopback: bool,
    ca_certs: str | None,
) -> FetchResponse:
    request_headers = HTTPHeaderDict(headers)
    previous: _Target | None = None
    redirects = 0
    while True:
        target = _parse(url, allow_loopback=allow_loopback)
        if previous is not None and _origin(target) != _origin(previous):
            request_headers = _without(request_headers, _ORIGIN_BOUND_HEADERS)
        addresses = _resolve(target, tenant=tenant, allow_loopback=allow_loopback,
                             deadline=deadline)
        pool, response = _send(
            target,
            addresses,
            method=method,
            headers=request_headers,
            body=body,
            connect_timeout=connect_timeout,
            read_timeout=read_timeout,
            deadline=deadline,
            ca_certs=ca_certs,
        )
        result = FetchResponse(
            url=url, host=target.host, response=response, pool=pool, max_bytes=max_bytes,
            deadline=deadline,
        )
        location = result.headers.get("Location")
        if max_redirects == 0 or result.status not in _REDIRECT_STATUSES or not location:
            return result
        result._release()
        if redirects == max_redirects:
            raise TooManyRedirects(f"more than {max_redirects} redirects")
        redirects += 1
        previous = target
        url = urljoin(url, location)
        # What browsers and requests do: 303 always, and 301/302 after a POST, become a GET.
        if result.status == 303 or (result.status in (301, 302) and method == "POST"):
            method = "HEAD" if method == "HEAD" else "GET"
            body = None
            request_headers = _without(request_headers, _BODY_HEADERS)


def url_mask(url: str) -> str:
    """A URL as records keep it (audit events, webhook delivery rows): its scheme, host and
    port, the rest masked. A webhook URL's path or query is often its credential (a token in
    a Slack-style hook path, `?key=`), and a record is read by more people, for longer,
    than the setting it came from."""
    if not url:
        return url
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        port = parts.port
    except ValueError:
        return "…"
    if not parts.scheme or not host:
        return "…"
    host = f"[{host}]" if ":" in host else host
    rest = parts.path not in ("", "/") or parts.query or parts.fragment
    return f"{parts.scheme}://{host}{f':{port}' if port else ''}/{'…' if rest else ''}"


def url_check(url: str, *, tenant: Hashable) -> None:
    """Refuse, without connecting, a URL that `fetch` would refuse (steps 1 and 2 above):
    for a URL saved now and fetched later, such as a webhook endpoint, so a bad one is
    refused when it is set. `fetch` checks again, since DNS answers change. Its lookup is
    `tenant`'s, as a fetch's is."""
    allow_loopback: bool = getattr(settings, "ANEX_FETCH_ALLOW_LOOPBACK", False)
    _resolve(_parse(url, allow_loopback=allow_loopback), tenant=tenant,
             allow_loopback=allow_loopback)


def _parse(url: str, *, allow_loopback: bool) -> _Target:
    if _UNSAFE_URL_CHARS.search(url):
        raise UnsafeURL("the URL contains whitespace, control characters or backslashes")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL("the URL is malformed") from exc
    if parts.scheme != "https" and not (parts.scheme == "http" and allow_loopback):
        raise UnsafeURL("only https URLs are allowed")
    if "@" in parts.netloc:
        raise UnsafeURL("the URL must not contain credentials")
    host = parts.hostname or ""
    if not host:
        raise UnsafeURL("the URL has no host")
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError as exc:
        raise UnsafeURL("the URL's host is not a valid name") from exc
    if not _HOST.fullmatch(host):
        raise UnsafeURL("the URL's host is not a valid name")
    if port == 0:
        raise UnsafeURL("the URL's port is not valid")
    default_port = _DEFAULT_PORTS[parts.scheme]
    port = port or default_port
    request_path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = f"[{host}]" if ":" in host else host
    if port != default_port:
        host_header = f"{host_header}:{port}"
    return _Target(parts.scheme, host, port, request_path, host_header)


# Name lookups run here, so one that hangs (a resolver that never answers, a name whose
# servers drop queries) is abandoned at the fetch's deadline instead of holding the fetch
# past it: getaddrinfo itself cannot be interrupted. A lookup abandoned keeps its thread
# until the system resolver gives up. One tenant's lookups hold at most TENANT_LOOKUPS of
# the threads, running or abandoned (issue 40 L5: a customer's zone whose servers drop
# queries took all 8 threads, and every other organization's ingests, probes and
# webhooks in the process waited out their deadlines behind it); a tenant past its share
# waits for one of its own to end, within its deadline, on its own thread.
RESOLVER_THREADS = 32
TENANT_LOOKUPS = 4
_RESOLVERS = ThreadPoolExecutor(max_workers=RESOLVER_THREADS, thread_name_prefix="anex-dns")
# The lookup's limit for url_check, which has no fetch deadline (a URL saved to be fetched
# later: the webhook endpoint).
RESOLVE_TIMEOUT = 10.0


class _TenantLookups:
    """How many lookups each tenant has on the resolver threads (queued, running, or
    abandoned and still running), at most TENANT_LOOKUPS each."""

    def __init__(self) -> None:
        self._held: dict[Hashable, int] = {}
        self._changed = threading.Condition()

    def take(self, tenant: Hashable, timeout: float) -> bool:
        """One of the tenant's lookups, waiting at most `timeout` for one to end; False
        when none did."""
        with self._changed:
            if not self._changed.wait_for(
                    lambda: self._held.get(tenant, 0) < TENANT_LOOKUPS, timeout=max(timeout, 0)):
                return False
            self._held[tenant] = self._held.get(tenant, 0) + 1
            return True

    def give(self, tenant: Hashable) -> None:
        with self._changed:
            left = self._held[tenant] - 1
            if left:
                self._held[tenant] = left
            else:
                del self._held[tenant]
            self._changed.notify_all()


_LOOKUPS = _TenantLookups()


def _getaddrinfo(target: _Target, timeout: float, tenant: Hashable) -> list[Any]:
    """The name's addresses, looked up on a resolver thread within `timeout`, as one of
    `tenant`'s lookups; FuturesTimeout past it (its share taken the whole time included)."""
    ends = time.monotonic() + timeout
    if not _LOOKUPS.take(tenant, timeout):
        raise FuturesTimeout

    def lookup() -> list[Any]:
        try:
            return socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM,
                                      proto=socket.IPPROTO_TCP)
        finally:
            _LOOKUPS.give(tenant)  # when the lookup ends, even one the fetch abandoned

    try:
        future = _RESOLVERS.submit(lookup)
    except BaseException:
        _LOOKUPS.give(tenant)
        raise
    try:
        return future.result(timeout=max(ends - time.monotonic(), 0))
    except FuturesTimeout:
        if future.cancel():  # never started: its share is given back here, not by lookup
            _LOOKUPS.give(tenant)
        raise


def _resolve(target: _Target, *, tenant: Hashable, allow_loopback: bool,
             deadline: _Deadline | None = None) -> list[IPAddress]:
    """Resolve once, within the fetch's deadline, and judge every address: one bad answer
    refuses the whole host.

    A name that does not resolve gets the same refusal as one that resolves to a private
    address, and neither names an address: any difference would tell a customer which
    names exist in our internal DNS."""
    not_public = UnsafeURL(f"{target.host} is not a public internet address")
    try:
        infos = _getaddrinfo(target, deadline.remaining() if deadline else RESOLVE_TIMEOUT,
                             tenant)
    except FuturesTimeout:
        if deadline is not None:
            raise deadline.unreachable(target.host) from None
        raise not_public from None
    except (OSError, UnicodeError):
        raise not_public from None
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    if not addresses or not all(
        _address_allowed(address, allow_loopback=allow_loopback) for address in addresses
    ):
        raise not_public
    if target.scheme == "http" and not all(a.is_loopback for a in addresses):
        raise UnsafeURL("only https URLs are allowed")
    return addresses


def _unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address carries (mapped, compatible, 6to4, NAT64), if any."""
    if isinstance(address, ipaddress.IPv4Address):
        return address
    embedded = address.ipv4_mapped or address.sixtofour
    if embedded is not None:
        return embedded
    if address in _NAT64 or 1 < int(address) < 2**32:  # NAT64 or IPv4-compatible ::a.b.c.d
        return ipaddress.IPv4Address(int(address) & 0xFFFF_FFFF)
    return address


def _address_allowed(address: IPAddress, *, allow_loopback: bool) -> bool:
    # Only 127/8 and ::1 as resolved count as loopback; a wrapped form such as
    # ::ffff:127.0.0.1 or 2002:7f00:1:: is refused even in tests.
    if address.is_loopback:
        return allow_loopback
    address = _unwrap(address)
    # is_global alone is not enough on Python 3.11: it calls multicast and some reserved
    # IPv6 ranges (64:ff9b:1::/48, local NAT64) global.
    return (
        address.is_global
        and not address.is_multicast
        and not address.is_reserved
        and not address.is_link_local
        and not address.is_unspecified
        and not any(address in network for network in _NOT_PUBLIC)
    )


def _send(
    target: _Target,
    addresses: list[IPAddress],
    *,
    method: str,
    headers: HTTPHeaderDict,
    body: bytes | None,
    connect_timeout: float,
    read_timeout: float,
    deadline: _Deadline,
    ca_certs: str | None,
) -> tuple[urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse]:
    """Connect to the first checked address that answers; never look the name up again."""
    request_headers = HTTPHeaderDict(headers)
    request_headers.discard("Host")  # the Host header always names the URL's host
    request_headers["Host"] = target.host_header
    request_headers.setdefault("User-Agent", "anex")
    last_error: HTTPError | None = None
    for address in addresses:
        # The name lookup or an earlier address may have used the time up.
        if deadline.passed():
            raise deadline.unreachable(target.host)
        timeout = urllib3.Timeout(connect=min(connect_timeout, deadline.remaining()),
                                  read=read_timeout)
        pool = _pool(target, address, timeout=timeout, deadline=deadline, ca_certs=ca_certs)
        try:
            response = pool.urlopen(
                method,
                target.request_path,
                body=body,
                headers=request_headers,
                redirect=False,
                retries=False,
                preload_content=False,
                decode_content=False,
            )
        except (NewConnectionError, ConnectTimeoutError) as exc:
            # Nothing was sent yet, so the next address (say IPv4 after IPv6) is safe to try.
            pool.close()
            last_error = exc
            continue
        except HTTPError as exc:
            pool.close()
            raise _translate(exc, target.host, deadline) from exc
        if deadline.expired:
            # Cut mid-headers, http.client takes the end of the stream for the end of the
            # headers and hands back a reply that never finished arriving.
            response.close()
            pool.close()
            raise deadline.unreachable(target.host)
        return pool, response
    assert last_error is not None  # addresses is never empty
    raise _translate(last_error, target.host, deadline) from last_error


def _pool(
    target: _Target,
    address: IPAddress,
    *,
    timeout: urllib3.Timeout,
    deadline: _Deadline,
    ca_certs: str | None,
) -> urllib3.HTTPConnectionPool:
    if target.scheme == "http":
        return _HTTPPool(str(address), target.port, timeout=timeout, deadline=deadline)
    # The pool's host is the checked address (where the socket goes); SNI and the
    # certificate check use the name from the URL.
    hostname = target.host.rstrip(".")
    return _HTTPSPool(
        str(address),
        target.port,
        timeout=timeout,
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_certs,
        server_hostname=hostname,
        assert_hostname=hostname,
        deadline=deadline,
    )


def no_reply(host: str) -> str:
    """Every failure before a reply began, in one message: a refused connection, a timeout
    and a failed TLS handshake told apart would make the fetcher a port scanner (closed,
    filtered, open but not TLS) of any public host a customer names."""
    return (f"{host} did not reply (the connection was refused or timed out, or its TLS "
            "certificate did not verify)")


def _translate(exc: HTTPError, host: str, deadline: _Deadline) -> FetchError:
    # Cut at the deadline, a connection fails in whatever way it was cut (a reset, a
    # truncated reply, a broken handshake): the deadline is the reason. The exception's
    # class still tells callers (a retry schedule) what happened; its message does not.
    if deadline.passed():
        return deadline.unreachable(host)
    if isinstance(exc, Urllib3Timeout) and not isinstance(exc, NewConnectionError):
        return FetchTimeout(no_reply(host))
    return FetchConnectionError(no_reply(host))


def _origin(target: _Target) -> tuple[str, str, int]:
    return target.scheme, target.host, target.port


def _without(headers: HTTPHeaderDict, names: frozenset[str]) -> HTTPHeaderDict:
    return HTTPHeaderDict({k: v for k, v in headers.items() if k.lower() not in names})
