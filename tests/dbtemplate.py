"""The fast tier's test databases, migrated once: the xdist controller migrates a template
database (in a child process, while the workers start and collect), and each worker's test
database is created from it (CREATE DATABASE ... TEMPLATE), so its own migrate finds every
migration applied. Three workers migrating at once each spent about 6 s of CPU on two cores.

The template is the project's migrations applied to an empty database, exactly what each
worker would build itself; a worker whose template failed builds its own, as before. It is
kept between runs under a name that carries a digest of what migrate reads (every installed
app's migrations, or its code where it has none, the settings, Django's version): the next
run on the same database server takes it as it is, and a changed migration names a new one
(the old ones are dropped). Migrating it cost about 3 s of CPU and 5 s of the workers' wait
at the start of every run."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

TEMPLATE_ENV = "ANEX_TEST_DB_TEMPLATE"
LOCK_ENV = "ANEX_TEST_DB_TEMPLATE_LOCK"
ROOT = Path(__file__).resolve().parent.parent


def template_start(database: dict[str, Any], run_dir: Path) -> dict[str, str]:
    """Start migrating the template (controller side), or find it migrated by an earlier
    run; the environment a worker needs to wait for it and take it, or {} when the database
    is not PostgreSQL."""
    if database["ENGINE"] != "django.db.backends.postgresql" or not os.environ.get(
            "DATABASE_URL"):
        return {}
    from psycopg import sql

    prefix = f"test_{database['NAME']}_template"
    name = f"{prefix}_{migrations_digest()}"
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / f"{name}.lock"
    done = run_dir / f"{name}.done"
    env = {TEMPLATE_ENV: name, LOCK_ENV: str(lock)}
    with _admin(database) as admin:
        kept = {row[0] for row in admin.execute(
            "SELECT datname FROM pg_database WHERE datname LIKE %s", [f"{prefix}%"])}
        if name in kept and done.exists():
            return env
        for stale in kept:  # an earlier digest's, or this one's unfinished
            admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                sql.Identifier(stale)))
            if stale != name:
                for marker in (run_dir / f"{stale}.lock", run_dir / f"{stale}.done"):
                    marker.unlink(missing_ok=True)
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    done.unlink(missing_ok=True)
    url = urlsplit(os.environ["DATABASE_URL"])
    child_env = {**os.environ, "DATABASE_URL": urlunsplit(url._replace(path=f"/{name}"))}
    # The child holds the lock until it exits: a worker's shared lock waits for it.
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        subprocess.Popen(
            ["/bin/sh", "-c", '"$0" manage.py migrate --run-syncdb -v0 && touch "$1"',
             sys.executable, str(done)],
            cwd=ROOT, env=child_env, pass_fds=(held.fileno(),), stdout=subprocess.DEVNULL)
    return env


def migrations_digest() -> str:
    """What a migrated database depends on, as 12 hex digits: each installed app's
    migrations (its models where it has none: --run-syncdb builds their tables), the module
    the project's migrations import, the settings, Django's version."""
    import django
    from django.apps import apps

    digest = hashlib.sha256(django.get_version().encode())
    files = [ROOT / "anex" / "settings.py", ROOT / "anex" / "db.py"]
    for config in sorted(apps.get_app_configs(), key=lambda config: config.label):
        migrations = Path(config.path) / "migrations"
        if migrations.is_dir():
            files += sorted(migrations.glob("*.py"))
        elif config.models_module is not None and config.models_module.__file__:
            models = Path(config.models_module.__file__)
            files += sorted(models.parent.rglob("*.py")) if models.name == "__init__.py" \
                else [models]
    for path in files:
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:12]


def template_take(database: dict[str, Any]) -> None:
    """Worker side: wait for the template, then create this worker's test database from
    it; without one (or if its migrate failed) the database is built as usual."""
    name, lock = os.environ.get(TEMPLATE_ENV), os.environ.get(LOCK_ENV)
    if not name or not lock:
        return
    with open(lock) as held:
        fcntl.flock(held, fcntl.LOCK_SH)
    if Path(lock).with_suffix(".done").exists():
        database.setdefault("TEST", {})["TEMPLATE"] = name


def _admin(database: dict[str, Any]) -> Any:
    import psycopg

    return psycopg.connect(dbname="postgres", host=database.get("HOST") or None,
                           port=database.get("PORT") or None,
                           user=database.get("USER") or None,
                           password=database.get("PASSWORD") or None, autocommit=True)
