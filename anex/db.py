"""Database-level guarantees shared by the apps' migrations."""

from __future__ import annotations

from django.db import migrations


def append_only(table: str) -> migrations.RunSQL:
    """A migration operation that makes PostgreSQL refuse UPDATE and DELETE on `table`.

    Used for records whose history is the product (the audit log, the credit ledger): no
    code path, admin action or stray shell can rewrite them.
    """
    function = f"{table}_append_only"
    return migrations.RunSQL(
        sql=f"""
            CREATE FUNCTION {function}() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
                RAISE EXCEPTION '% is append-only: % refused', TG_TABLE_NAME, TG_OP
                    USING ERRCODE = 'restrict_violation';
            END $$;
            CREATE TRIGGER {function}
                BEFORE UPDATE OR DELETE ON {table}
                FOR EACH ROW EXECUTE FUNCTION {function}();
        """,
        reverse_sql=f"""
            DROP TRIGGER IF EXISTS {function} ON {table};
            DROP FUNCTION IF EXISTS {function}();
        """,
    )
