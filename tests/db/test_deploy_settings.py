"""Deployment settings (issue 11, item 9): check --deploy is clean with DEBUG off, the
proxy headers are trusted only when configured, cookies are secure, HSTS is sent, the
sign-in rate limits are shared through Redis, and email verification is mandatory."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest
from allauth.account.models import EmailAddress
from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.cache import cache
from django.test import Client

ROOT = Path(__file__).resolve().parents[2]


def deployment_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ANEX_", "DEBUG"))}
    env.update(DEBUG="false", ANEX_SSL_REDIRECT="true", SECRET_KEY=secrets.token_urlsafe(50),
               ANEX_ADMIN_HOST="admin.example.com", DJANGO_SETTINGS_MODULE="anex.settings")
    env.update(extra)
    return env


def setting_in(env: dict[str, str], name: str) -> str:
    code = f"from django.conf import settings; print(repr(settings.{name}))"
    result = subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                            capture_output=True, text=True, timeout=120, check=True)
    return result.stdout.strip()


def test_check_deploy_is_clean_with_debug_off() -> None:
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=deployment_env(), cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def settings_start(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    code = "from django.conf import settings; print(repr(settings.ANEX_ADMIN_HOST))"
    return subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=120, check=False)


def test_the_admin_host_is_required_with_debug_off() -> None:
    # Issue 40 L10: a deployment that forgot ANEX_ADMIN_HOST served the admin on its public
    # API hosts. Now it does not start.
    unset = deployment_env()
    del unset["ANEX_ADMIN_HOST"]
    refused = settings_start(unset)
    assert refused.returncode != 0
    assert "ANEX_ADMIN_HOST is required with DEBUG off" in refused.stderr
    # nor with an API host for it
    on_api = settings_start(deployment_env(ANEX_ADMIN_HOST="api.anex.sh"))
    assert on_api.returncode != 0 and "is an API host" in on_api.stderr
    # a host of its own starts; with DEBUG on (a developer's machine) none is needed
    assert settings_start(deployment_env()).stdout.strip() == "'admin.example.com'"
    assert settings_start({**unset, "DEBUG": "true"}).stdout.strip() == "None"


def test_the_admin_on_every_host_is_said_out_loud_and_check_deploy_warns() -> None:
    everywhere = deployment_env(ANEX_ADMIN_HOST="*")
    assert settings_start(everywhere).stdout.strip() == "None"
    result = subprocess.run(
        [sys.executable, "manage.py", "check", "--deploy", "--fail-level", "WARNING"],
        env=everywhere, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode != 0
    assert "anex.W001" in result.stdout + result.stderr


def test_forwarded_headers_are_trusted_only_behind_a_configured_proxy() -> None:
    # Directly connected, a client's own X-Forwarded-Proto must not make http look https,
    # nor its X-Forwarded-For pick the address the sign-in rate limits count.
    direct = deployment_env()
    assert setting_in(direct, "SECURE_PROXY_SSL_HEADER") == "None"
    assert setting_in(direct, "ALLAUTH_TRUSTED_PROXY_COUNT") == "0"
    proxied = deployment_env(ANEX_TRUSTED_PROXY_COUNT="1")
    assert setting_in(proxied, "SECURE_PROXY_SSL_HEADER") == "('HTTP_X_FORWARDED_PROTO', 'https')"
    assert setting_in(proxied, "ALLAUTH_TRUSTED_PROXY_COUNT") == "1"


@pytest.mark.django_db
def test_https_responses_carry_hsts_and_cookies_are_secure() -> None:
    assert settings.SESSION_COOKIE_SECURE and settings.CSRF_COOKIE_SECURE
    response = Client().get("/healthz", secure=True)
    assert response["Strict-Transport-Security"] == \
        "max-age=31536000; includeSubDomains; preload"
    # A spoofed X-Forwarded-Proto on plain http is not https without a trusted proxy.
    spoofed = Client().get("/healthz", HTTP_X_FORWARDED_PROTO="https")
    assert "Strict-Transport-Security" not in spoofed


def test_the_rate_limit_cache_is_redis_shared_by_every_process() -> None:
    assert settings.CACHES["default"]["BACKEND"] == "django.core.cache.backends.redis.RedisCache"
    key = f"test:{secrets.token_hex(8)}"
    cache.set(key, 3, 30)
    code = ("import django; django.setup(); from django.core.cache import cache; "
            f"print(cache.get({key!r}))")
    other = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                           text=True, timeout=120, check=True)
    assert other.stdout.strip() == "3"
    cache.delete(key)


@pytest.mark.django_db
def test_an_unverified_address_cannot_sign_in() -> None:
    assert settings.ACCOUNT_EMAIL_VERIFICATION == "mandatory"
    email = f"new-{secrets.token_hex(6)}@example.com"
    user = get_user_model().objects.create_user(email.split("@")[0], email, "a-good-password-9")
    EmailAddress.objects.create(user=user, email=email, verified=False, primary=True)
    client = Client(REMOTE_ADDR="203.0.113.9")
    response = client.post("/accounts/login/", {"login": email, "password": "a-good-password-9"})
    assert response.status_code == 302 and "confirm-email" in response["Location"]
    assert "_auth_user_id" not in client.session
