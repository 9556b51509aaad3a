"""Nothing in the product keeps state on a database session, so it runs behind PgBouncer in
transaction pooling mode (docs/deploy.md, "PgBouncer"), where each transaction may get
another server connection: no session-level advisory lock (pg_advisory_xact_lock ends with
its transaction), no SET or set_config that outlives its transaction, no LISTEN, no
prepared statement or cursor held past a transaction. Read from the source; the settings
that turn Django's own off are held by tests/e2e/test_pgbouncer.py."""

from __future__ import annotations

import re

from tests.product import product_sources, relative

SESSION_STATE = {
    "a session-level advisory lock": re.compile(r"pg_(try_)?advisory_lock(_shared)?\s*\("),
    # SQL is written in capitals here; a sentence starting "Set ..." is not a statement.
    "a SET that outlives its transaction": re.compile(
        r"""["']\s*(SET|RESET)\s+(?!LOCAL\b)[A-Za-z_]+"""),
    "a set_config for the session": re.compile(r"set_config\([^)]*,\s*(false|%s)\s*\)",
                                               re.IGNORECASE),
    "LISTEN/NOTIFY": re.compile(r"""["']\s*(LISTEN|NOTIFY|UNLISTEN)\s"""),
    "a prepared statement": re.compile(r"prepare\s*=\s*True|[\"']\s*PREPARE\s"),
    "a cursor held past its transaction": re.compile(r"WITH\s+HOLD", re.IGNORECASE),
}


def test_the_product_keeps_no_state_on_a_database_session() -> None:
    found = [f"{relative(path)}:{number}: {what}: {line.strip()}"
             for path in product_sources()
             for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for what, pattern in SESSION_STATE.items() if pattern.search(line)]
    assert not found, "\n".join(found)


def test_the_scan_finds_what_it_looks_for() -> None:
    lines = ['cursor.execute("SELECT pg_advisory_lock(1)")', 'cursor.execute("SET search_path '
             'TO x")', "cursor.execute(\"SELECT set_config('lock_timeout', %s, false)\")",
             'conn.execute("LISTEN jobs")', 'cursor.execute(query, prepare=True)']
    assert all(any(p.search(line) for p in SESSION_STATE.values()) for line in lines)
    fine = ['cursor.execute("SELECT pg_advisory_xact_lock(hashtext(%s))", [key])',
            "cursor.execute(\"SELECT set_config('lock_timeout', %s, true)\", [previous])",
            'cursor.execute("SET LOCAL statement_timeout = 500")']
    assert not any(p.search(line) for p in SESSION_STATE.values() for line in fine)
