"""Issue 22, L9: what each limiter does when Redis cannot be reached
(docs/dev/decisions/2026-12-02-limiters-when-redis-fails.md). Each test takes Redis away from
the limiters (a client on a closed port) and performs the limited action: a limiter that fails
open lets it through, one that fails closed refuses it with nothing done."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from django.test import RequestFactory
from rest_framework.test import APIClient

from anex.redis import client_for
from console.constants import Role
from console.models import ApiKey, Organization
from jobs.models import PreflightCheck
from tests.db.test_console import form
from tests.factories import input_ready

pytestmark = pytest.mark.django_db
JOB = "/batch/v1/jobs/0b6e4e9c-58d4-4b4e-9f4e-1c2b3a4d5e6f"


@pytest.fixture
def redis_down(monkeypatch: pytest.MonkeyPatch) -> None:
    # The product's own client (its timeouts and retries), on a port nothing listens on.
    closed = client_for("redis://127.0.0.1:1/0")
    monkeypatch.setattr("anex.redis.redis_client", lambda: closed)


def test_a_redis_that_is_down_is_retried_once_without_waiting() -> None:
    """redis-py's default, ten retries with exponential backoff, held every request about
    4 s before a limiter could fail open or closed (and this file's 62 requests 4 minutes)."""
    retry = client_for("redis://127.0.0.1:1/0").get_retry()
    assert retry is not None and retry.get_retries() == 1
    with pytest.raises(redis.ConnectionError):
        client_for("redis://127.0.0.1:1/0").incr("anex:test")


def test_a_keys_and_its_organizations_rate_fail_open(api: APIClient, redis_down: None) -> None:
    # The API stays up: credits and budgets, in PostgreSQL, still bound the spend.
    assert [api.get(JOB).status_code for _ in range(3)] == [404, 404, 404]


def test_invalid_keys_fail_open(redis_down: None) -> None:
    # Past the limit's 60 a minute, still 401: the key's own randomness is the guard.
    client = APIClient()
    bad = "Bearer sk-" + "a" * 12 + "_" + "b" * 40
    assert {client.get(JOB, HTTP_AUTHORIZATION=bad).status_code for _ in range(62)} == {401}


def test_checks_per_minute_fail_closed(api: APIClient, organization: Organization,
                                       checkpoints: Path, redis_down: None) -> None:
    item = input_ready(organization, b'{"custom_id": "a", "method": "POST", "url": '
                                     b'"/v1/chat/completions", "body": {"messages": '
                                     b'[{"role": "user", "content": "hi"}]}}\n')
    response = api.post("/batch/v1/checks", {"input_id": str(item.pk), "model": "gemma4-12b"},
                        format="json")
    assert response.status_code == 503 and int(response["Retry-After"]) >= 1
    assert not PreflightCheck.objects.exists()


def test_uploads_fail_open(redis_down: None) -> None:
    from jobs.storage_views import _throttled

    assert _throttled(RequestFactory().post("/storage/world/upload")) is None


def test_console_actions_fail_open(organization: Organization, redis_down: None) -> None:
    from tests.db.test_console import signed_in

    owner, owner_user = signed_in(organization, Role.OWNER, reauthenticated=True)
    owner.post("/console/keys", form(organization, {"name": "during the outage"}))
    assert ApiKey.objects.filter(created_by=owner_user).count() == 1


def test_each_limiter_says_how_it_fails() -> None:
    """window_hit takes no default: every caller decides (and its decision record says so)."""
    import inspect

    from anex.redis import window_hit

    assert inspect.signature(window_hit).parameters["fail"].default is inspect.Parameter.empty
    section = (Path(__file__).parents[2] / "docs" / "dev" / "decisions"
               / "2026-12-02-limiters-when-redis-fails.md").read_text()
    for limiter in ("ratelimit", "ratelimit-org", "invalid-keys", "checks", "uploads",
                    "console-actions", "webhook-tests"):
        assert f"`{limiter}`" in section, limiter
