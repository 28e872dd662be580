"""Trigram indexes for the text filter (`icontains` on external_id and preview).

PostgreSQL only: Django compiles icontains to UPPER(col::text) LIKE UPPER(%s), which these
expression indexes serve; SQLite (the embedded default) has no equivalent and scans.
"""

from django.db import migrations

INDEXED_COLUMNS = ("external_id", "preview")


def create_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    schema_editor.execute("CREATE EXTENSION IF NOT EXISTS pg_trgm")
    for column in INDEXED_COLUMNS:
        schema_editor.execute(
            f"CREATE INDEX IF NOT EXISTS trace_{column}_trgm ON reviewapp_trace "
            f'USING gin ((UPPER("{column}"::text)) gin_trgm_ops)'
        )


def drop_indexes(apps, schema_editor):
    if schema_editor.connection.vendor != "postgresql":
        return
    for column in INDEXED_COLUMNS:
        schema_editor.execute(f"DROP INDEX IF EXISTS trace_{column}_trgm")


class Migration(migrations.Migration):
    dependencies = [("reviewapp", "0004_training")]
    operations = [migrations.RunPython(create_indexes, drop_indexes)]
