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

Bodies are streamed under a byte cap. Redirects are handed back to the caller unless
``max_redirects`` allows following them. Every failure is a `FetchError` whose message is
safe to show the customer.
"""

from __future__ import annotations

import ipaddress
import re
import socket
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import TracebackType
from typing import Literal, Self
from urllib.parse import urljoin, urlsplit

import urllib3
from django.conf import settings
from urllib3 import HTTPHeaderDict
from urllib3.exceptions import (
    ConnectTimeoutError,
    HTTPError,
    NewConnectionError,
    SSLError,
)
from urllib3.exceptions import TimeoutError as Urllib3Timeout

Method = Literal["GET", "HEAD", "POST"]
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0  # per socket read, not for the whole body
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

# Python's is_global treats shared address space as non-global already; the refusal is
# spelled out because carrier-grade NAT is a classic way into a provider's internal network.
_CGNAT = ipaddress.IPv4Network("100.64.0.0/10")
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


class FetchError(Exception):
    """Base of every failure; the message is safe to show the customer."""


class UnsafeURL(FetchError):
    """Refused before any connection: bad scheme, malformed URL or a non-public address."""


class FetchTimeout(FetchError):
    """The connect or a read took longer than its timeout."""


class FetchConnectionError(FetchError):
    """The host could not be resolved or reached, TLS failed, or the reply was broken."""


class TooLarge(FetchError):
    """The body is (or says it is) larger than the caller's byte cap."""


class TooManyRedirects(FetchError):
    """A redirect chain went past ``max_redirects``."""


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
    ) -> None:
        self.url = url
        self.status: int = response.status
        self.headers: Mapping[str, str] = response.headers  # case-insensitive
        self.max_bytes = max_bytes
        self._host = host
        self._response = response
        self._pool = pool

    @property
    def content_length(self) -> int | None:
        """The size the server advertises, or None when it does not say (or says nonsense)."""
        value = self.headers.get("Content-Length", "").strip()
        return int(value) if value.isascii() and value.isdigit() else None

    def iter_chunks(self, chunk_size: int = CHUNK_SIZE) -> Iterator[bytes]:
        """Yield the body as sent on the wire (not decompressed), at most ``max_bytes`` in all.

        Raises TooLarge before reading anything when the advertised size is over the cap, and
        as soon as the body passes the cap otherwise; closes the response when done.
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
                if not chunk:
                    return
                received += len(chunk)
                if received > self.max_bytes:
                    raise TooLarge(f"the response is larger than {self.max_bytes} bytes")
                yield chunk
        except HTTPError as exc:
            raise _translate(exc, self._host) from exc
        finally:
            self.close()

    def read(self) -> bytes:
        """The whole body, for small replies (a webhook's answer); bounded by ``max_bytes``."""
        return b"".join(self.iter_chunks())

    def close(self) -> None:
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
    headers: Mapping[str, str] | None = None,
    body: bytes | None = None,
    max_bytes: int = MAX_BYTES,
    max_redirects: int = 0,
    connect_timeout: float = CONNECT_TIMEOUT,
    read_timeout: float = READ_TIMEOUT,
) -> FetchResponse:
    """Send one request to a customer-supplied URL, refusing anything not on the public internet.

    A 3xx comes back as a response unless ``max_redirects`` > 0; then each hop is checked
    like the first, and a chain longer than that raises TooManyRedirects. The body is not
    read: use ``iter_chunks()``/``read()``, and ``close()`` (or ``with``) when done.
    """
    if method not in _METHODS:
        raise ValueError(f"unsupported method {method!r}")
    if max_redirects < 0:
        raise ValueError("max_redirects must be >= 0")
    allow_loopback: bool = getattr(settings, "ANEX_FETCH_ALLOW_LOOPBACK", False)
    ca_certs: str | None = getattr(settings, "ANEX_FETCH_CA_BUNDLE", None)
    timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
    request_headers = HTTPHeaderDict(headers)
    previous: _Target | None = None
    redirects = 0
    while True:
        target = _parse(url, allow_loopback=allow_loopback)
        if previous is not None and _origin(target) != _origin(previous):
            request_headers = _without(request_headers, _ORIGIN_BOUND_HEADERS)
        addresses = _resolve(target, allow_loopback=allow_loopback)
        pool, response = _send(
            target,
            addresses,
            method=method,
            headers=request_headers,
            body=body,
            timeout=timeout,
            ca_certs=ca_certs,
        )
        result = FetchResponse(
            url=url, host=target.host, response=response, pool=pool, max_bytes=max_bytes
        )
        location = result.headers.get("Location")
        if max_redirects == 0 or result.status not in _REDIRECT_STATUSES or not location:
            return result
        result.close()
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


def url_check(url: str) -> None:
    """Refuse, without connecting, a URL that `fetch` would refuse (steps 1 and 2 above):
    for a URL saved now and fetched later, such as a webhook endpoint, so a bad one is
    refused when it is set. `fetch` checks again, since DNS answers change."""
    allow_loopback: bool = getattr(settings, "ANEX_FETCH_ALLOW_LOOPBACK", False)
    _resolve(_parse(url, allow_loopback=allow_loopback), allow_loopback=allow_loopback)


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


def _resolve(target: _Target, *, allow_loopback: bool) -> list[IPAddress]:
    """Resolve once and judge every address: one bad answer refuses the whole host."""
    try:
        infos = socket.getaddrinfo(
            target.host, target.port, type=socket.SOCK_STREAM, proto=socket.IPPROTO_TCP
        )
    except (OSError, UnicodeError) as exc:
        raise FetchConnectionError(f"could not resolve {target.host}") from exc
    addresses = list(dict.fromkeys(ipaddress.ip_address(info[4][0]) for info in infos))
    if not addresses:
        raise FetchConnectionError(f"could not resolve {target.host}")
    for address in addresses:
        if not _address_allowed(address, allow_loopback=allow_loopback):
            # The address itself stays out of the message: it would map internal DNS.
            raise UnsafeURL(f"{target.host} is not a public internet address")
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
        and address not in _CGNAT
    )


def _send(
    target: _Target,
    addresses: list[IPAddress],
    *,
    method: str,
    headers: HTTPHeaderDict,
    body: bytes | None,
    timeout: urllib3.Timeout,
    ca_certs: str | None,
) -> tuple[urllib3.HTTPConnectionPool, urllib3.BaseHTTPResponse]:
    """Connect to the first checked address that answers; never look the name up again."""
    request_headers = HTTPHeaderDict(headers)
    request_headers.discard("Host")  # the Host header always names the URL's host
    request_headers["Host"] = target.host_header
    request_headers.setdefault("User-Agent", "anex")
    last_error: HTTPError | None = None
    for address in addresses:
        pool = _pool(target, address, timeout=timeout, ca_certs=ca_certs)
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
            raise _translate(exc, target.host) from exc
        return pool, response
    assert last_error is not None  # addresses is never empty
    raise _translate(last_error, target.host) from last_error


def _pool(
    target: _Target, address: IPAddress, *, timeout: urllib3.Timeout, ca_certs: str | None
) -> urllib3.HTTPConnectionPool:
    if target.scheme == "http":
        return urllib3.HTTPConnectionPool(str(address), target.port, timeout=timeout)
    # The pool's host is the checked address (where the socket goes); SNI and the
    # certificate check use the name from the URL.
    hostname = target.host.rstrip(".")
    return urllib3.HTTPSConnectionPool(
        str(address),
        target.port,
        timeout=timeout,
        cert_reqs="CERT_REQUIRED",
        ca_certs=ca_certs,
        server_hostname=hostname,
        assert_hostname=hostname,
    )


def _translate(exc: HTTPError, host: str) -> FetchError:
    # NewConnectionError subclasses ConnectTimeoutError in urllib3, so it is checked first.
    if isinstance(exc, NewConnectionError):
        return FetchConnectionError(f"could not connect to {host}")
    if isinstance(exc, Urllib3Timeout):
        return FetchTimeout(f"{host} did not answer in time")
    if isinstance(exc, SSLError):
        return FetchConnectionError(f"could not verify the TLS certificate of {host}")
    return FetchConnectionError(f"the connection to {host} failed")


def _origin(target: _Target) -> tuple[str, str, int]:
    return target.scheme, target.host, target.port


def _without(headers: HTTPHeaderDict, names: frozenset[str]) -> HTTPHeaderDict:
    return HTTPHeaderDict({k: v for k, v in headers.items() if k.lower() not in names})
