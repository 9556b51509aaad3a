"""The fast tier's test databases, migrated once: the xdist controller migrates a template
database (in a child process, while the workers start and collect), and each worker's test
database is created from it (CREATE DATABASE ... TEMPLATE), so its own migrate finds every
migration applied. Three workers migrating at once each spent about 6 s of CPU on two cores.

The template is the project's migrations applied to an empty database, exactly what each
worker would build itself; a worker whose template failed builds its own, as before."""

from __future__ import annotations

import fcntl
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
    """Start migrating the template (controller side); the environment a worker needs to
    wait for it and take it, or {} when the database is not PostgreSQL."""
    if database["ENGINE"] != "django.db.backends.postgresql" or not os.environ.get(
            "DATABASE_URL"):
        return {}
    import psycopg
    from psycopg import sql

    name = f"test_{database['NAME']}_template"
    with psycopg.connect(dbname="postgres", host=database.get("HOST") or None,
                         port=database.get("PORT") or None, user=database.get("USER") or None,
                         password=database.get("PASSWORD") or None, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    run_dir.mkdir(parents=True, exist_ok=True)
    lock = run_dir / f"{name}.lock"
    done = run_dir / f"{name}.done"
    done.unlink(missing_ok=True)
    url = urlsplit(os.environ["DATABASE_URL"])
    env = {**os.environ, "DATABASE_URL": urlunsplit(url._replace(path=f"/{name}"))}
    # The child holds the lock until it exits: a worker's shared lock waits for it.
    with lock.open("w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        subprocess.Popen(
            ["/bin/sh", "-c", '"$0" manage.py migrate --run-syncdb -v0 && touch "$1"',
             sys.executable, str(done)],
            cwd=ROOT, env=env, pass_fds=(held.fileno(),), stdout=subprocess.DEVNULL)
    return {TEMPLATE_ENV: name, LOCK_ENV: str(lock)}


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


def template_drop(database: dict[str, Any], name: str) -> None:
    """Controller side, once the workers are done with it."""
    import psycopg
    from psycopg import sql

    with psycopg.connect(dbname="postgres", host=database.get("HOST") or None,
                         port=database.get("PORT") or None, user=database.get("USER") or None,
                         password=database.get("PASSWORD") or None, autocommit=True) as admin:
        admin.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
            sql.Identifier(name)))
