"""anex behind PgBouncer in transaction pooling mode (docs/deploy.md, "PgBouncer"): Debian's
pgbouncer on a free loopback port in front of this run's PostgreSQL, with a pool smaller
than its clients (so transactions of different clients share server connections; Debian's
1.18 carries no prepared statement between them); the web and CPU worker roles reach the database
only through it, with ANEX_DB_POOLER=pgbouncer. A job goes its whole database path through
it: submit, the real estimate actor, approve, the start that plans and releases chunks,
and the finalize that merges and charges once. The chunks' engine work is written here as
a worker writes it (tests/chunks.py): this tier runs no engine."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.db import connection

from billing.models import LedgerEntry
from billing.services import credits_summary
from inference.constants import RowOutcome
from inference.pricing import Usage
from jobs import dispatch
from jobs.models import Chunk, Job
from tests.chunks import chunk_done, row_record
from tests.factories import api_key_make, input_ready, organization_make
from tests.roles import (
    ROOT,
    broker_empty,
    database_url,
    role_environment,
    role_running,
    until_alive,
)
from tests.servers import free_port

pytestmark = [
    pytest.mark.django_db(transaction=True),
    pytest.mark.skipif(shutil.which("pgbouncer") is None,
                       reason="Debian's pgbouncer is not installed (apt-get install pgbouncer; "
                              ".ci/run installs it)"),
]
MODEL = "qwen3-embedding-8b"
ROWS = 5


@contextmanager
def pgbouncer_running() -> Iterator[int]:
    """PgBouncer in transaction mode in front of this run's database; yields its port."""
    db = connection.settings_dict
    port = free_port()
    # Its configuration is read before it drops root (it refuses to run as root), so a
    # private directory serves either way.
    directory = Path(tempfile.mkdtemp(prefix="pgbouncer-"))
    (directory / "users.txt").write_text(f'"{db["USER"]}" "{db["PASSWORD"] or ""}"\n')
    (directory / "pgbouncer.ini").write_text(f"""
[databases]
{db["NAME"]} = host={db["HOST"]} port={db["PORT"] or 5432} dbname={db["NAME"]}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {directory / "users.txt"}
admin_users = {db["USER"]}
pool_mode = transaction
; Fewer server connections than the roles' clients: their transactions share them, and
; each transaction takes the next server connection in turn, never the last one it had.
default_pool_size = 3
server_round_robin = 1
max_client_conn = 200
ignore_startup_parameters = extra_float_digits
""")
    command = ["pgbouncer", str(directory / "pgbouncer.ini")]
    if os.geteuid() == 0:
        # A database on a unix socket (make test's embedded PostgreSQL) is reached as the
        # owner of its socket's directory, which only that user may enter.
        host = str(db["HOST"] or "")
        command[1:1] = ["-u", Path(host).owner() if host.startswith("/")
                        else db["USER"] or "postgres"]
    log = (directory / "pgbouncer.log").open("wb")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not stats(port):
            assert process.poll() is None, (directory / "pgbouncer.log").read_text()
            time.sleep(0.1)
        yield port
    finally:
        process.terminate()
        process.wait(timeout=30)
        log.close()
        shutil.rmtree(directory, ignore_errors=True)


def stats(port: int) -> dict[str, dict[str, Any]]:
    """PgBouncer's SHOW STATS by database ({} while it does not answer)."""
    try:
        with psycopg.connect(host="127.0.0.1", port=port, dbname="pgbouncer",
                             user=connection.settings_dict["USER"], autocommit=True,
                             prepare_threshold=None, connect_timeout=2) as admin:
            cursor = admin.cursor()
            cursor.execute("SHOW STATS")
            names = [column.name for column in cursor.description or ()]
            return {row[0]: dict(zip(names, row, strict=True)) for row in cursor.fetchall()}
    except psycopg.OperationalError:
        return {}


def call(method: str, url: str, key: str, body: dict[str, Any] | None = None) -> Any:
    request = urllib.request.Request(  # noqa: S310 - loopback
        url, method=method, data=None if body is None else json.dumps(body).encode(),
        headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310 - loopback
        return json.loads(response.read())


def test_a_job_runs_its_database_path_through_pgbouncer_in_transaction_mode(
        tokenizer_dir: Path, tmp_path: Path) -> None:
    # given an organization, its key and its input, and anex's roles behind PgBouncer
    organization = organization_make()
    _key, plaintext = api_key_make(organization)
    content = b"".join(json.dumps({"custom_id": f"r{i}", "method": "POST",
                                   "url": "/v1/embeddings", "body": {"input": "a plain text "
                                                                     "string"}}).encode()
                       + b"\n" for i in range(ROWS))
    item = input_ready(organization, content)
    broker_empty()
    web_port = free_port()
    jobs = f"http://127.0.0.1:{web_port}/batch/v1/jobs"
    with pgbouncer_running() as port:
        pooled = {"DATABASE_URL": database_url(host="127.0.0.1", port=port),
                  "ANEX_DB_POOLER": "pgbouncer", "ANEX_CHECKPOINTS": f"{MODEL}={tokenizer_dir}",
                  "ANEX_CHUNK_ROWS": "2"}
        name = connection.settings_dict["NAME"]
        before = stats(port).get(name, {}).get("total_xact_count", 0)
        with role_running("web", log=tmp_path / "web.log", ANEX_WEB_BIND=f"127.0.0.1:{web_port}",
                          ANEX_WEB_WORKERS="1", ANEX_WEB_THREADS="4", **pooled) as web, \
                role_running("worker-cpu", log=tmp_path / "worker.log",
                             ANEX_CPU_WORKER_THREADS="4", **pooled) as worker:
            def status(job_id: str) -> str:
                try:
                    return str(call("GET", f"{jobs}/{job_id}", plaintext)["status"])
                except OSError:
                    return ""

            # when it is submitted through the web tier and estimated by the real actor
            until_alive(lambda: _answers(web_port), web, tmp_path / "web.log")
            job_id = call("POST", jobs, plaintext, {"input_id": str(item.pk), "model": MODEL})["id"]
            until_alive(lambda: status(job_id) == "cost_ready", worker, tmp_path / "worker.log")
            # approved through the web tier, started (planned, released) by the real actor
            call("POST", f"{jobs}/{job_id}/approve", plaintext)
            until_alive(lambda: Chunk.objects.filter(job_id=job_id).count() == 3, worker,
                        tmp_path / "worker.log")
            # the engine's part, written as a GPU worker writes it
            for chunk in Chunk.objects.filter(job_id=job_id).order_by("index"):
                chunk_done(chunk, [row_record(i, f"r{i}", RowOutcome.SUCCESS,
                                              Usage(input_tokens=4), embedding=[0.5, 0.5])
                                   for i in range(chunk.first_row,
                                                  chunk.first_row + chunk.row_count)])
            # and finalized by the real actor
            dispatch.send("job_finalize_task", str(job_id))
            until_alive(lambda: status(job_id) == "done", worker, tmp_path / "worker.log")
            result = call("GET", f"{jobs}/{job_id}", plaintext)
        after = stats(port)[name]["total_xact_count"]
    # then it is done, charged once, and every one of its transactions went through PgBouncer
    assert result["status"] == "done", result
    job = Job.objects.get(pk=job_id)
    assert job.success_rows == ROWS
    kinds = sorted(LedgerEntry.objects.filter(job=job).values_list("kind", flat=True))
    assert kinds in (["charge", "hold", "release"], ["charge", "hold"]), kinds
    assert credits_summary(organization=organization).held == 0
    assert after - before > 20, (before, after)


# Django's .iterator() outside a transaction: a server-side cursor declared WITH HOLD and
# fetched from in later transactions, which PgBouncer may serve on another connection.
ITERATE = """
import django
django.setup()
from django.db.migrations.recorder import MigrationRecorder
print(sum(1 for _ in MigrationRecorder.Migration.objects.iterator(chunk_size=1)))
"""


def test_server_side_cursors_are_off_behind_pgbouncer(tmp_path: Path) -> None:
    with pgbouncer_running() as port:
        url = database_url(host="127.0.0.1", port=port)
        # three transactions at once: three server connections for the next ones to rotate on
        clients = [psycopg.connect(url, prepare_threshold=None) for _ in range(3)]
        for client in clients:
            client.execute("SELECT 1")
        for client in clients:
            client.commit()  # a client leaving mid-transaction would take its server along
            client.close()

        def iterate(pooler: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run([sys.executable, "-c", ITERATE], cwd=ROOT, text=True,
                                  capture_output=True, timeout=120,
                                  env=role_environment(DATABASE_URL=url, ANEX_DB_POOLER=pooler))

        pooled = iterate("pgbouncer")
        plain = iterate("none")
    assert pooled.returncode == 0, pooled.stderr
    assert int(pooled.stdout) > 10
    # Without the setting the cursor is looked for on another connection: the test can fail.
    assert plain.returncode != 0 and "does not exist" in plain.stderr, plain.stderr


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5):
            return True
    except OSError:
        return False
