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
        "SECRET_KEY": "x" * 40,
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
])
def test_a_bad_value_stops_the_process_at_start(name: str, value: str, message: str) -> None:
    result = _start_django(**{name: value})
    assert result.returncode != 0
    assert "ImproperlyConfigured" in result.stderr
    assert message in result.stderr


def test_a_fraction_is_above_zero_and_at_most_one() -> None:
    assert env(F="0.5").fraction("F", 0.9) == 0.5
    assert env().fraction("F", 0.9) == 0.9
    for bad in ("0", "1.01", "-0.2", "nan"):
        with pytest.raises(ImproperlyConfigured, match="must be above 0 and at most 1"):
            env(F=bad).fraction("F", 0.9)
