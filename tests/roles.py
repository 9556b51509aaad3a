"""The deployment's roles (anex/roles.py) started as processes, as a supervisor or a
container starts them, against this test run's PostgreSQL and Redis: for the tests that
watch a role come up and do its work (tests/e2e/test_roles.py, test_pgbouncer.py)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

from django.conf import settings
from django.db import connection

ROOT = Path(__file__).resolve().parent.parent


def database_url(*, host: str | None = None, port: int | None = None) -> str:
    """This test run's database, as a role's DATABASE_URL (another host and port: a pooler
    in front of it)."""
    db = connection.settings_dict
    user = quote(db["USER"])
    password = f":{quote(db['PASSWORD'])}" if db["PASSWORD"] else ""
    if host is None and db["HOST"].startswith("/"):
        return f"postgresql://{user}{password}@/{db['NAME']}?host={quote(db['HOST'])}"
    return (f"postgresql://{user}{password}@{host or db['HOST']}:"
            f"{port or db['PORT'] or 5432}/{db['NAME']}")


def role_environment(**overrides: str) -> dict[str, str]:
    """The test process's environment with its services: what every role reads."""
    environment = {key: value for key, value in os.environ.items()
                   if not key.startswith(("ANEX_WORKER_", "ANEX_WEB_"))}
    environment.update(DATABASE_URL=database_url(), REDIS_URL=settings.REDIS_URL,
                       SECRET_KEY=settings.SECRET_KEY, ANEX_STORAGE_BACKEND="local",
                       ANEX_STORAGE_ROOT=str(settings.ANEX_STORAGE_ROOT))
    environment.update(overrides)
    return environment


@contextmanager
def role_running(role: str, *args: str, log: Path,
                 **environment: str) -> Iterator[subprocess.Popen[bytes]]:
    """`python -m anex.roles ROLE ARGS` until the block ends (then its process group is
    stopped), its output in `log`."""
    with log.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "anex.roles", role, *args],
                                   cwd=ROOT, env=role_environment(**environment), stdout=out,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield process
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def until_alive(done: Callable[[], bool], process: subprocess.Popen[bytes], log: Path,
                timeout: float = 120) -> None:
    """Wait for done() while the role's process lives; fail with its output otherwise."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and not done():
        assert process.poll() is None, log.read_text(errors="replace")
        time.sleep(0.2)
    assert done(), log.read_text(errors="replace")
