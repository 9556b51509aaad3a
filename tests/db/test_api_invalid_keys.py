"""Issue 11: a flood of invalid API keys is rate limited per client, like any other traffic.

A request with an invalid key has no key to count against; before, it was never counted,
so one client could make the API look keys up as fast as it could send them. Each test
comes from its own address so the counts of other tests (all from 127.0.0.1) stay apart.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from pytest_django import Settings
from rest_framework.test import APIClient

import anex.redis
from anex.api import throttling
from anex.redis import redis_client
from console.apikeys import api_key_for_plaintext
from console.models import ApiKey

pytestmark = [pytest.mark.django_db, pytest.mark.urls("tests.urls")]
LIMIT = 5


@pytest.fixture(autouse=True)
def small_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(throttling, "INVALID_KEYS_PER_MINUTE", LIMIT)


@pytest.fixture
def addresses() -> Iterator[Callable[[], str]]:
    """Fresh client addresses; their counters are removed afterwards."""
    made: list[str] = []

    def make() -> str:
        suffix = uuid.uuid4().hex
        made.append(f"2001:db8::{suffix[:4]}:{suffix[4:8]}:{suffix[8:12]}")
        return made[-1]

    yield make
    client = redis_client()
    for address in made:
        for counter in client.scan_iter(f"anex:invalid-keys:{address}:*"):
            client.delete(counter)


def probe(client: APIClient, key: ApiKey, address: str, header: str):  # type: ignore[no-untyped-def]
    return client.get(f"/batch/v1/_probe/keys/{key.pk}", HTTP_AUTHORIZATION=header,
                      REMOTE_ADDR=address)


def test_an_invalid_key_flood_is_429_per_client(key_pair: tuple[ApiKey, str],
                                                addresses: Callable[[], str],
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    key, plaintext = key_pair
    attacker, bystander = addresses(), addresses()
    lookups: list[str] = []

    def counted(raw: str) -> ApiKey | None:
        lookups.append(raw)
        return api_key_for_plaintext(raw)

    monkeypatch.setattr("anex.api.authentication.api_key_for_plaintext", counted)
    client = APIClient()

    # when one client floods guessed keys
    flood = [probe(client, key, attacker, f"Bearer sk-guess-{n}").status_code
             for n in range(LIMIT + 20)]

    # then it gets its 401s up to the limit, then 429s
    assert flood == [401] * LIMIT + [429] * 20
    assert len(lookups) == LIMIT + 20
    refused = probe(client, key, attacker, "Bearer sk-guess-again")
    assert refused.json() == {"detail": throttling.INVALID_KEYS_DETAIL, "error": {
        "code": "rate_limit_exceeded", "message": throttling.INVALID_KEYS_DETAIL}}
    assert 1 <= int(refused["Retry-After"]) <= 60
    # an empty bearer counts too
    assert probe(client, key, attacker, "Bearer ").status_code == 429
    # a valid key from the same address (a colleague behind one NAT) still works
    assert probe(client, key, attacker, f"Bearer {plaintext}").status_code == 200
    # and another client, with a valid key or an invalid one, is unaffected
    assert probe(client, key, bystander, f"Bearer {plaintext}").status_code == 200
    assert probe(client, key, bystander, "Bearer sk-typo").status_code == 401


def test_valid_keys_are_not_counted_as_invalid(key_pair: tuple[ApiKey, str],
                                               addresses: Callable[[], str]) -> None:
    key, plaintext = key_pair
    address = addresses()
    client = APIClient()
    assert all(probe(client, key, address, f"Bearer {plaintext}").status_code == 200
               for _ in range(LIMIT + 2))
    assert probe(client, key, address, "Bearer sk-nope").status_code == 401


def test_behind_trusted_proxies_the_client_is_the_forwarded_address(
        key_pair: tuple[ApiKey, str], addresses: Callable[[], str],
        settings: Settings) -> None:
    settings.ANEX_TRUSTED_PROXY_COUNT = 1
    key, _plaintext = key_pair
    attacker, other = addresses(), addresses()
    client = APIClient()

    def from_(address: str, spoofed: str):  # type: ignore[no-untyped-def]
        # A client may prepend anything to X-Forwarded-For; the proxy appends the truth.
        return client.get(f"/batch/v1/_probe/keys/{key.pk}", HTTP_AUTHORIZATION="Bearer x",
                          REMOTE_ADDR="10.0.0.2",
                          HTTP_X_FORWARDED_FOR=f"{spoofed}, {address}")

    codes = [from_(attacker, f"203.0.113.{n}").status_code for n in range(LIMIT + 1)]
    assert codes == [401] * LIMIT + [429]
    assert from_(other, attacker).status_code == 401


def test_the_limiter_never_takes_the_api_down(key_pair: tuple[ApiKey, str],
                                              addresses: Callable[[], str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    key, plaintext = key_pair

    class Down:
        def __getattr__(self, name: str) -> object:
            raise redis.ConnectionError("redis is down")

    monkeypatch.setattr(anex.redis, "redis_client", lambda: Down())
    client = APIClient()
    address = addresses()
    assert [probe(client, key, address, "Bearer sk-nope").status_code
            for _ in range(LIMIT + 2)] == [401] * (LIMIT + 2)
    assert probe(client, key, address, f"Bearer {plaintext}").status_code == 200
