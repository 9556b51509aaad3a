"""Strict readers for configuration from the environment.

Every reader fails with ImproperlyConfigured naming the variable and what was wrong, so a
bad deployment stops at start instead of misbehaving later.
"""

from __future__ import annotations

import ipaddress
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, unquote, urlsplit

from django.core.exceptions import ImproperlyConfigured

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class Env:
    """Reads typed values from a mapping (os.environ by default)."""

    def __init__(self, source: Mapping[str, str] | None = None) -> None:
        self.source = os.environ if source is None else source

    def _raw(self, name: str) -> str | None:
        value = self.source.get(name)
        return None if value is None else value.strip()

    def string(self, name: str, default: str | None = None, *, required: bool = False) -> str:
        value = self._raw(name)
        if value:
            return value
        if required or default is None:
            raise ImproperlyConfigured(f"{name} is required but not set.")
        return default

    def optional_str(self, name: str) -> str | None:
        return self._raw(name) or None

    def boolean(self, name: str, default: bool) -> bool:
        value = self._raw(name)
        if value is None:
            return default
        lowered = value.lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ImproperlyConfigured(
            f"{name}={value!r} is not a boolean: use one of 1/0, true/false, yes/no, on/off."
        )

    def integer(self, name: str, default: int, *, minimum: int | None = None,
            maximum: int | None = None) -> int:
        value = self._raw(name)
        if not value:
            return default
        try:
            number = int(value)
        except ValueError:
            raise ImproperlyConfigured(f"{name}={value!r} is not a whole number.") from None
        if minimum is not None and number < minimum:
            raise ImproperlyConfigured(f"{name}={number} is below the minimum of {minimum}.")
        if maximum is not None and number > maximum:
            raise ImproperlyConfigured(f"{name}={number} is above the maximum of {maximum}.")
        return number

    def fraction(self, name: str, default: float) -> float:
        """A number above 0 and at most 1, such as 0.9."""
        value = self._raw(name)
        if not value:
            return default
        try:
            number = float(value)
        except ValueError:
            raise ImproperlyConfigured(f"{name}={value!r} is not a number.") from None
        if not 0 < number <= 1:
            raise ImproperlyConfigured(f"{name}={value!r} must be above 0 and at most 1.")
        return number

    def csv_list(self, name: str, default: list[str]) -> list[str]:
        value = self._raw(name)
        if value is None:
            return list(default)
        return [item.strip() for item in value.split(",") if item.strip()]

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self._raw(name) or default
        if value not in choices:
            raise ImproperlyConfigured(
                f"{name}={value!r} is not one of: {', '.join(choices)}."
            )
        return value

    def secret(self, name: str, *, min_length: int, min_distinct: int = 1) -> str:
        value = self.string(name, required=True)
        secret_check(name, value, min_length=min_length, min_distinct=min_distinct)
        return value

    def optional_secret(self, name: str, *, min_length: int) -> str:
        """A secret that may be unset (""); when set, held to secret_check."""
        value = self._raw(name) or ""
        if value:
            secret_check(name, value, min_length=min_length)
        return value

    def prefixed_secret(self, name: str, prefixes: tuple[str, ...]) -> str | None:
        value = self.optional_str(name)
        if value is not None and not value.startswith(prefixes):
            raise ImproperlyConfigured(
                f"{name} does not look right: it should start with {' or '.join(prefixes)}."
            )
        return value

    def origin(self, name: str, default: str) -> str:
        """An http(s) origin: scheme and host (and port), no path, query or fragment."""
        value = self._raw(name) or default
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ImproperlyConfigured(
                f"{name}={value!r} is not an origin such as https://api.example.com."
            )
        if parts.path not in ("", "/") or parts.query or parts.fragment:
            raise ImproperlyConfigured(
                f"{name}={value!r} must be an origin only, with no path or query."
            )
        _port_of(name, value)
        return f"{parts.scheme}://{parts.netloc}"

    def optional_host(self, name: str) -> str | None:
        """A bare host name such as admin.example.com (no scheme, port or path), lowercased."""
        value = self._raw(name)
        if not value:
            return None
        try:
            parts = urlsplit(f"//{value}")
            port = parts.port
        except ValueError:
            port = -1
        if parts.hostname != value.lower() or port is not None:
            raise ImproperlyConfigured(
                f"{name}={value!r} is not a bare host name such as admin.example.com."
            )
        return value.lower()

    def path_mapping(self, name: str) -> dict[str, Path]:
        """`key=/path;key=/path`, every path an existing directory."""
        value = self._raw(name)
        mapping: dict[str, Path] = {}
        for item in (value or "").split(";"):
            if not item.strip():
                continue
            key, sep, path = item.partition("=")
            if not sep or not key.strip() or not path.strip():
                raise ImproperlyConfigured(f"{name}: {item.strip()!r} is not key=/path.")
            directory = Path(path.strip())
            if not directory.is_dir():
                raise ImproperlyConfigured(f"{name}: {directory} is not a directory.")
            mapping[key.strip()] = directory
        return mapping

    def url_lists(self, name: str) -> dict[str, tuple[str, ...]]:
        """`key=url,url;key=url`: each key's URLs in order, a key named twice adding its
        URLs to the first's. Each is https://host[:port] (an engine on another machine), or
        plain http:// to a loopback address (this one, where nothing crosses a network)."""
        mapping: dict[str, tuple[str, ...]] = {}
        for item in (self._raw(name) or "").split(";"):
            if not item.strip():
                continue
            key, sep, urls = (part.strip() for part in item.partition("="))
            for url in (url.strip() for url in urls.split(",")):
                parts = urlsplit(url)
                if not sep or not key or parts.scheme not in ("http", "https") \
                        or not parts.hostname or parts.path not in ("", "/") or parts.query:
                    raise ImproperlyConfigured(
                        f"{name}: {item.strip()!r} is not "
                        "model-id=https://host:port (or http://127.0.0.1:port).")
                if parts.scheme == "http" and not loopback_host(parts.hostname):
                    raise ImproperlyConfigured(
                        f"{name}: {url!r} is plain http:// to another machine: use "
                        "https:// (plain http:// is only for an engine on a loopback address).")
                mapping[key] = (*mapping.get(key, ()), url.rstrip("/"))
        return mapping

    def database(self, name: str = "DATABASE_URL", *, min_password: int = 0) -> dict[str, Any]:
        """The URL's database; a password it carries is held to secret_check with
        `min_password` (none, as a local socket's trust or peer authentication has, is the
        server's choice)."""
        database = parse_database_url(name, self.string(name, required=True))
        if database["PASSWORD"]:
            secret_check(f"The password in {name}", database["PASSWORD"],
                         min_length=min_password)
        return database

    def redis_url(self, name: str = "REDIS_URL", *, min_password: int = 0) -> str:
        value = self.string(name, required=True)
        parts = urlsplit(value)
        if parts.password:
            secret_check(f"The password in {name}", unquote(parts.password),
                         min_length=min_password)
        if parts.scheme in ("redis", "rediss"):
            if not parts.hostname:
                raise ImproperlyConfigured(f"{name}={_redact(value)!r} names no host.")
            _port_of(name, value)
            db = parts.path.lstrip("/")
            if db and not db.isdigit():
                raise ImproperlyConfigured(
                    f"{name}={_redact(value)!r}: the database after the host must be a number."
                )
        elif parts.scheme == "unix":
            if not parts.path:
                raise ImproperlyConfigured(f"{name}={_redact(value)!r} names no socket path.")
        else:
            raise ImproperlyConfigured(
                f"{name}={_redact(value)!r} must start with redis://, rediss:// or unix://."
            )
        return value


# What .env.example leaves in place of each secret (CHANGEME, CHANGEME-postgres, …), and
# the prefix of the key `django-admin startproject` writes: never a secret, whatever its length.
PLACEHOLDER_MARKS = ("changeme", "django-insecure-")


def secret_check(name: str, value: str, *, min_length: int, min_distinct: int = 1) -> None:
    """ImproperlyConfigured unless `value` can be a secret: no placeholder left from an
    example file, at least `min_length` characters and `min_distinct` different ones.
    The message names the variable and never echoes the value, not even a short one."""
    if any(mark in value.lower() for mark in PLACEHOLDER_MARKS):
        raise ImproperlyConfigured(
            f"{name} is still the example's placeholder: set a random secret of its own "
            "(`openssl rand -base64 48` prints one).")
    if len(value) < min_length:
        raise ImproperlyConfigured(
            f"{name} is too short: use at least {min_length} random characters.")
    if len(set(value)) < min_distinct:
        raise ImproperlyConfigured(
            f"{name} repeats too few characters to be random: use at least {min_distinct} "
            "different ones.")


def loopback_host(host: str) -> bool:
    """localhost, a name under .localhost (RFC 6761: always this machine) or a loopback
    address."""
    host = host.strip("[]").lower()
    if host == "localhost" or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def parse_database_url(name: str, value: str) -> dict[str, Any]:
    """Turn a PostgreSQL URL into Django's DATABASES entry.

    Accepts postgres:// and postgresql://, with a host, or with `?host=/socket/dir` as libpq
    does for a Unix socket. Other query parameters become connection options.
    """
    parts = urlsplit(value)
    if parts.scheme not in ("postgres", "postgresql"):
        raise ImproperlyConfigured(
            f"{name}={_redact(value)!r} must be a PostgreSQL URL (postgresql://…); "
            "anex runs on PostgreSQL only."
        )
    database = unquote(parts.path.lstrip("/"))
    if not database:
        raise ImproperlyConfigured(f"{name}={_redact(value)!r} names no database.")
    options = dict(parse_qsl(parts.query))
    host = options.pop("host", None) or parts.hostname or ""
    if not host:
        raise ImproperlyConfigured(
            f"{name}={_redact(value)!r} names no host (nor ?host=/socket/dir)."
        )
    port = _port_of(name, value)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": database,
        "USER": unquote(parts.username or ""),
        "PASSWORD": unquote(parts.password or ""),
        "HOST": host,
        "PORT": str(port) if port else "",
        "OPTIONS": options,
    }


def _port_of(name: str, value: str) -> int | None:
    try:
        return urlsplit(value).port
    except ValueError:
        raise ImproperlyConfigured(f"{name}={_redact(value)!r} has a port that is not a number.") \
            from None


def _redact(url: str) -> str:
    """The URL with any password replaced, so errors never print a credential."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return parts._replace(netloc=netloc).geturl()
