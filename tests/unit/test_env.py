"""Settings read the environment strictly and fail at start with a clear message."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from django.core.exceptions import ImproperlyConfigured

from anex.env import Env, parse_database_url

ROOT = Path(__file__).resolve().parents[2]
# A production-grade key: DEBUG is off, so settings want check --deploy's 50 characters.
SECRET_KEY = "a-test-key-of-sixty-characters-0123456789-abcdefghijklmnopqrs"


def env(**values: str) -> Env:
    return Env(values)


@pytest.mark.parametrize("value,expected", [("1", True), ("yes", True), ("off", False),
                                            ("FALSE", False)])
def test_booleans_accept_the_usual_spellings(value: str, expected: bool) -> None:
    assert env(DEBUG=value).boolean("DEBUG", not expected) is expected


def test_a_boolean_that_is_not_one_fails_naming_the_variable() -> None:
    with pytest.raises(ImproperlyConfigured, match=r"DEBUG='maybe' is not a boolean"):
        env(DEBUG="maybe").boolean("DEBUG", False)


def test_integers_are_checked_for_form_and_range() -> None:
    with pytest.raises(ImproperlyConfigured, match="is not a whole number"):
        env(N="ten").integer("N", 1)
    with pytest.raises(ImproperlyConfigured, match="below the minimum of 1"):
        env(N="0").integer("N", 5, minimum=1)
    assert env(N="7").integer("N", 5, minimum=1) == 7
    assert env().integer("N", 5) == 5


def test_choices_name_the_allowed_values() -> None:
    with pytest.raises(ImproperlyConfigured, match="is not one of: local, s3"):
        env(B="gcs").choice("B", "local", ("local", "s3"))


def test_a_required_value_that_is_missing_says_so() -> None:
    with pytest.raises(ImproperlyConfigured, match="DATABASE_URL is required"):
        env().database()


def test_a_short_secret_is_refused_without_echoing_it() -> None:
    with pytest.raises(ImproperlyConfigured) as error:
        env(SECRET_KEY="hunter2").secret("SECRET_KEY", min_length=32)
    assert "hunter2" not in str(error.value)
    assert "at least 32" in str(error.value)


def test_stripe_keys_must_look_like_stripe_keys() -> None:
    with pytest.raises(ImproperlyConfigured, match="should start with whsec_"):
        env(S="abc").prefixed_secret("S", ("whsec_",))
    assert env().prefixed_secret("S", ("whsec_",)) is None


@pytest.mark.parametrize("url,message", [
    ("mysql://root@localhost/anex", "must be a PostgreSQL URL"),
    ("postgresql://postgres@localhost", "names no database"),
    ("postgresql://postgres@localhost:fivefour/anex", "port that is not a number"),
    ("postgresql:///anex", "names no host"),
])
def test_bad_database_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        parse_database_url("DATABASE_URL", url)


def test_database_url_errors_never_print_the_password() -> None:
    with pytest.raises(ImproperlyConfigured) as error:
        parse_database_url("DATABASE_URL", "mysql://anex:s3cr3t@db/anex")
    assert "s3cr3t" not in str(error.value)


def test_database_urls_take_hosts_and_unix_sockets() -> None:
    tcp = parse_database_url("DATABASE_URL",
                             "postgres://u:p%40ss@db.internal:6543/anex?sslmode=require")
    assert (tcp["HOST"], tcp["PORT"], tcp["NAME"], tcp["USER"], tcp["PASSWORD"]) == (
        "db.internal", "6543", "anex", "u", "p@ss")
    assert tcp["OPTIONS"] == {"sslmode": "require"}
    socket = parse_database_url("DATABASE_URL", "postgresql://postgres:@/anex?host=/run/pg")
    assert socket["HOST"] == "/run/pg" and socket["OPTIONS"] == {}


@pytest.mark.parametrize("url,message", [
    ("http://localhost:6379", "must start with redis://"),
    ("redis://localhost:6379/zero", "must be a number"),
    ("redis://:6379/0", "names no host"),
    ("unix://", "names no socket path"),
])
def test_bad_redis_urls_are_refused(url: str, message: str) -> None:
    with pytest.raises(ImproperlyConfigured, match=message):
        env(REDIS_URL=url).redis_url()


def test_origins_must_be_bare_origins() -> None:
    assert env(O="https://api.example.com/").origin("O", "x") == "https://api.example.com"
    with pytest.raises(ImproperlyConfigured, match="no path or query"):
        env(O="https://api.example.com/v1").origin("O", "x")
    with pytest.raises(ImproperlyConfigured, match="is not an origin"):
        env(O="api.example.com").origin("O", "x")


def _start_django(**overrides: str) -> subprocess.CompletedProcess[str]:
    environment = {key: value for key, value in os.environ.items()
                   if key not in ("DATABASE_URL", "REDIS_URL", "SECRET_KEY")}
    environment.update({
        "DATABASE_URL": "postgresql://postgres@127.0.0.1:5432/anex",
        "REDIS_URL": "redis://127.0.0.1:6379/0",
        "SECRET_KEY": SECRET_KEY,
        "DJANGO_SETTINGS_MODULE": "anex.settings",
    })
    environment.update(overrides)
    return subprocess.run([sys.executable, "-c", "import django; django.setup()"],
                          env=environment, cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_the_process_starts_with_good_settings() -> None:
    assert _start_django().returncode == 0


@pytest.mark.parametrize("name,value,message", [
    ("DATABASE_URL", "sqlite:///db.sqlite3", "must be a PostgreSQL URL"),
    ("REDIS_URL", "localhost:6379", "must start with redis://"),
    ("SECRET_KEY", "short", "SECRET_KEY is too short"),
    ("DEBUG", "perhaps", "DEBUG='perhaps' is not a boolean"),
    ("ANEX_EU_API_ORIGIN", "https://api.anex.sh", "must name different hosts"),
    ("ANEX_STORAGE_BACKEND", "ftp", "ANEX_STORAGE_BACKEND='ftp' is not one of"),
    # The worker roles' settings (anex/roles.py).
    ("ANEX_GPU_MEMORY_FRACTION", "90%", "ANEX_GPU_MEMORY_FRACTION='90%' is not a number"),
    ("ANEX_TENSOR_PARALLEL_SIZE", "0", "ANEX_TENSOR_PARALLEL_SIZE=0 is below the minimum"),
    ("ANEX_WORKER_REGIONS", "world,us", "must name one or both of world and eu"),
    # Issue 40 L3: a worker's metrics port beyond loopback only with the token.
    ("ANEX_WORKER_METRICS_HOST", "0.0.0.0",  # noqa: S104 - the attack
     "ANEX_WORKER_METRICS_HOST='0.0.0.0' serves a worker's metrics and readiness beyond "
     "this machine: set ANEX_METRICS_TOKEN"),
])
def test_a_bad_value_stops_the_process_at_start(name: str, value: str, message: str) -> None:
    result = _start_django(**{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


# Issue 40 M5: what .env.example leaves in place of each secret, and secrets too short to
# be one, stop every role at start with DEBUG off (a deployment; make run and make test
# too, whose launcher makes a 64-character key and passwordless local services).
STRONG = "Zq7-fK2pW9xLmR4vT8nB3cY6hJ1sD5gA0eU"


@pytest.mark.parametrize("overrides,message", [
    ({"SECRET_KEY": "CHANGEME"}, "SECRET_KEY is still the example's placeholder"),
    ({"SECRET_KEY": "CHANGEME-" + "x" * 60}, "SECRET_KEY is still the example's placeholder"),
    ({"SECRET_KEY": "django-insecure-" + STRONG * 2},
     "SECRET_KEY is still the example's placeholder"),
    # the old bar, 32 characters, is below check --deploy's 50
    ({"SECRET_KEY": STRONG[:40]}, "SECRET_KEY is too short: use at least 50"),
    ({"SECRET_KEY": "ab" * 40}, "SECRET_KEY repeats too few characters"),
    ({"ANEX_ENCRYPTION_KEY": "CHANGEME"}, "ANEX_ENCRYPTION_KEY is still the example's"),
    ({"DATABASE_URL": "postgresql://anex:CHANGEME-postgres@postgres:5432/anex"},
     "The password in DATABASE_URL is still the example's placeholder"),
    ({"DATABASE_URL": "postgresql://anex:secret@postgres:5432/anex"},
     "The password in DATABASE_URL is too short: use at least 16"),
    ({"REDIS_URL": "redis://:CHANGEME-redis@redis:6379/0"},
     "The password in REDIS_URL is still the example's placeholder"),
    ({"REDIS_URL": "redis://:hunter2@redis:6379/0"},
     "The password in REDIS_URL is too short"),
    ({"ANEX_REALTIME_ENGINE_SECRET": "CHANGEME-another-random-secret"},
     "ANEX_REALTIME_ENGINE_SECRET is still the example's placeholder"),
    ({"ANEX_REALTIME_ENGINE_SECRET": "s3cret"},
     "ANEX_REALTIME_ENGINE_SECRET is too short: use at least 32"),
    ({"ANEX_STORAGE_BACKEND": "s3", "ANEX_S3_BUCKET": "w", "ANEX_S3_EU_BUCKET": "e",
      "AWS_SECRET_ACCESS_KEY": "CHANGEME-minio"},
     "AWS_SECRET_ACCESS_KEY is still the example's placeholder"),
    ({"ANEX_STORAGE_BACKEND": "s3", "ANEX_S3_BUCKET": "w", "ANEX_S3_EU_BUCKET": "e",
      "AWS_SECRET_ACCESS_KEY": STRONG, "MINIO_ROOT_PASSWORD": STRONG},
     "AWS_SECRET_ACCESS_KEY is MinIO's root password"),
])
def test_a_placeholder_or_short_secret_stops_the_process_at_start(
        overrides: dict[str, str], message: str) -> None:
    result = _start_django(DEBUG="false", **overrides)
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr
    # never the secret itself, not even in part
    for value in overrides.values():
        if "CHANGEME" in value or value in (STRONG[:40], "secret", "hunter2", "s3cret"):
            assert value not in result.stderr


def test_real_secrets_start_and_debug_keeps_the_looser_bar() -> None:
    # given strong secrets everywhere, and passwordless local services (make test's)
    assert _start_django(
        DEBUG="false", DATABASE_URL=f"postgresql://anex:{STRONG}@127.0.0.1:5432/anex",
        REDIS_URL=f"redis://:{STRONG}@127.0.0.1:6379/0",
        ANEX_REALTIME_ENGINE_SECRET=STRONG).returncode == 0
    assert _start_django(DEBUG="false").returncode == 0
    # a developer's DEBUG machine keeps the 32-character key, never a placeholder
    assert _start_django(DEBUG="true", SECRET_KEY=STRONG).returncode == 0
    assert _start_django(DEBUG="true", SECRET_KEY="CHANGEME" * 8).returncode != 0


def test_a_worker_metrics_port_beyond_loopback_starts_with_the_token() -> None:
    assert _start_django(ANEX_WORKER_METRICS_HOST="0.0.0.0",  # noqa: S104
                         ANEX_METRICS_TOKEN=STRONG).returncode == 0
    assert _start_django(ANEX_WORKER_METRICS_HOST="::1").returncode == 0


# Issue 40 L13: customers' signed links travel over https in production (DEBUG off), or to
# a loopback host (make run's http://localhost).
S3 = {"ANEX_STORAGE_BACKEND": "s3", "ANEX_S3_BUCKET": "w", "ANEX_S3_EU_BUCKET": "e"}


@pytest.mark.parametrize("overrides,message", [
    ({"ANEX_API_ORIGIN": "http://api.example.com"},
     "ANEX_API_ORIGIN='http://api.example.com': customers' signed links"),
    ({"ANEX_EU_API_ORIGIN": "http://api-eu.example.com"},
     "ANEX_EU_API_ORIGIN='http://api-eu.example.com': customers' signed links"),
    ({**S3, "ANEX_S3_ENDPOINT_URL": "http://minio:9000"},
     "or set ANEX_S3_PUBLIC_ENDPOINT_URL to the https address"),
    ({**S3, "ANEX_S3_ENDPOINT_URL": "http://minio:9000",
      "ANEX_S3_PUBLIC_ENDPOINT_URL": "http://storage.example.com"},
     "ANEX_S3_PUBLIC_ENDPOINT_URL='http://storage.example.com': customers' signed links"),
])
def test_plain_http_signed_links_stop_a_production_process(overrides: dict[str, str],
                                                           message: str) -> None:
    result = _start_django(DEBUG="false", **overrides)
    assert result.returncode != 0
    assert message in result.stderr


@pytest.mark.parametrize("overrides", [
    {"ANEX_API_ORIGIN": "http://localhost:8000", "ANEX_EU_API_ORIGIN": "http://eu.localhost:8000"},
    {**S3, "ANEX_S3_ENDPOINT_URL": "http://minio:9000",
     "ANEX_S3_PUBLIC_ENDPOINT_URL": "https://storage.example.com"},
    {**S3, "ANEX_S3_ENDPOINT_URL": "http://127.0.0.1:9000"},
    {**S3},  # AWS itself
    {"DEBUG": "true", "ANEX_API_ORIGIN": "http://api.example.com"},
])
def test_https_or_loopback_signed_links_start(overrides: dict[str, str]) -> None:
    result = _start_django(**{"DEBUG": "false", **overrides})
    assert result.returncode == 0, result.stderr


def test_a_fraction_is_above_zero_and_at_most_one() -> None:
    assert env(F="0.5").fraction("F", 0.9) == 0.5
    assert env().fraction("F", 0.9) == 0.9
    for bad in ("0", "1.01", "-0.2", "nan"):
        with pytest.raises(ImproperlyConfigured, match="must be above 0 and at most 1"):
            env(F=bad).fraction("F", 0.9)
