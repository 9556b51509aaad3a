"""API key authentication: `Authorization: Bearer <key>` or `x-api-key: <key>`."""

from __future__ import annotations

from typing import Any, NoReturn

from django.db import InterfaceError, OperationalError
from rest_framework import exceptions
from rest_framework.authentication import BaseAuthentication
from rest_framework.request import Request

from anex.api.throttling import invalid_key_count
from anex.errors import Unavailable
from console.actors import Actor
from console.apikeys import api_key_for_plaintext, api_key_mark_used
from console.models import ApiKey, Organization

KEY_UNVERIFIABLE_DETAIL = (
    "The API key could not be validated right now, so nothing was done. Retry."
)


def presented_key(request: Request) -> str | None:
    """The key a request carries, '' for a header that carries none, None for no header."""
    authorization = request.headers.get("Authorization")
    if authorization is not None:
        scheme, _, token = authorization.strip().partition(" ")
        return token.strip() if scheme.lower() == "bearer" else ""
    api_key = request.headers.get("x-api-key")
    if api_key is not None:
        return api_key.strip()
    return None


class ApiKeyAuthentication(BaseAuthentication):
    def authenticate(self, request: Request) -> tuple[Any, ApiKey] | None:
        raw = presented_key(request)
        if raw is None:
            return None  # the permission check answers 422 for the missing header
        if not raw:
            _refuse_invalid(request)
        try:
            key = api_key_for_plaintext(raw)
            if key is not None:
                api_key_mark_used(key=key)
        except (OperationalError, InterfaceError):
            raise Unavailable(KEY_UNVERIFIABLE_DETAIL) from None
        if key is None:
            _refuse_invalid(request)
        return (None, key)

    def authenticate_header(self, request: Request) -> str:
        return 'Bearer realm="anex"'


def request_key(request: Request) -> ApiKey:
    key = request.auth
    assert isinstance(key, ApiKey), "view reached without an API key"
    return key


def request_organization(request: Request) -> Organization:
    return request_key(request).organization


def request_actor(request: Request) -> Actor:
    return Actor(key=request_key(request))


def _refuse_invalid(request: Request) -> NoReturn:
    """401, or 429 once this client has sent too many invalid keys this minute. A key has
    no count of its own until it is found, so invalid ones are counted per client. The limit
    is applied only after the (indexed, cheap) lookup failed: a valid key is never refused
    for what another client behind the same address sent."""
    invalid_key_count(request)
    raise exceptions.AuthenticationFailed()
